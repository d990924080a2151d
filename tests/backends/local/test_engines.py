"""The two engines: routing replay, determinism, noise, and what generate/score return."""
import pytest
import torch

from harness.backends.local import train_engine
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import build_policy
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.spec import load


@pytest.fixture(scope="module")
def setup():
    cfg = load(["model=moe_tiny", "inference.router_noise_sigma=0"])  # the natural engine, no knob
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(32, torch.Generator().manual_seed(0))
    return cfg, policy, task, prompts


def test_generate_returns_tokens_logprobs_and_routed_experts(setup):
    cfg, policy, task, prompts = setup
    eng = InferenceEngine(policy, cfg.inference, seed=0)
    roll = eng.generate(prompts, task.answer_len)
    b, t = prompts.shape[0], task.prompt_len + task.answer_len
    assert roll.tokens.shape == (b, t) and torch.equal(roll.tokens[:, : task.prompt_len], prompts)
    assert roll.logp.shape == (b, task.answer_len) and torch.all(roll.logp <= 0)
    m = cfg.model
    assert roll.routed_experts.shape == (b, t, m.n_layers, m.top_k)
    assert torch.all(roll.routed_experts[:, -1] == -1) and torch.all(roll.routed_experts[:, :-1] >= 0)
    assert roll.router_logp.shape == (b, task.answer_len, m.n_layers, m.n_experts)


def test_r3_replay_reproduces_rollout_experts_with_gradient_into_the_router(setup):
    cfg, policy, task, prompts = setup
    roll = InferenceEngine(policy, cfg.inference, seed=1).generate(prompts, task.answer_len)
    own = train_engine.forward(policy, roll.tokens)
    out = train_engine.forward(policy, roll.tokens, replay=roll.routed_experts)
    processed = slice(0, roll.tokens.shape[1] - 1)  # every position the inference engine processed
    assert torch.equal(out.selected[:, processed], roll.routed_experts[:, processed])
    # without replay the training router picks other experts for some tokens (bf16 + random
    # combine order flip near-ties): the replay is what makes them equal
    own_sets = own.selected[:, processed].sort(-1).values
    assert (own_sets != roll.routed_experts[:, processed].sort(-1).values).any()
    # ... and the gates come from the training router's logits over the replayed set
    logits = out.router_logits[:, processed]
    sel = roll.routed_experts[:, processed]
    expect = torch.softmax(logits.gather(-1, sel), -1)
    _, gates = train_engine.route(logits, cfg.model.top_k, sel)
    torch.testing.assert_close(gates, expect)
    policy.zero_grad()
    logp = train_engine.response_view(out, roll.tokens, task.prompt_len).logp
    logp.sum().backward()
    for block in policy.blocks:
        assert block.ffn.router.grad is not None and block.ffn.router.grad.abs().sum() > 0
    policy.zero_grad()


def test_train_engine_is_deterministic(setup):
    cfg, policy, task, prompts = setup
    tokens = torch.cat([prompts, prompts[:, :5]], 1)
    a = TrainEngine(policy).logprobs(tokens, task.prompt_len)
    b = TrainEngine(policy).logprobs(tokens, task.prompt_len)
    assert torch.equal(a.logp, b.logp)


def _score_var(cfg, policy, task, prompts, **inference):
    icfg = type(cfg.inference)(**{**cfg.inference.__dict__, **inference})
    eng = InferenceEngine(policy, icfg, seed=2)
    roll = eng.generate(prompts, task.answer_len)
    return eng.score(roll.tokens, task.prompt_len, 6).var(0).mean().item()


def test_deterministic_mode_has_zero_scoring_variance_and_default_moe_does_not(setup):
    cfg, policy, task, prompts = setup
    assert _score_var(cfg, policy, task, prompts, deterministic=True) == 0.0
    assert _score_var(cfg, policy, task, prompts) > 0.0


def test_dense_twin_has_equal_active_parameters():
    moe = build_policy(load(["model=moe_tiny"]).model, 0)
    dense = build_policy(load(["model=dense_tiny"]).model, 0)
    assert moe.active_params() == dense.active_params()
    assert sum(p.numel() for p in moe.parameters()) > sum(p.numel() for p in dense.parameters())


def test_logprobs_modes_agree_at_temperature_one_and_differ_otherwise(setup):
    cfg, policy, task, prompts = setup
    roll = InferenceEngine(policy, cfg.inference, seed=3).generate(prompts, task.answer_len)
    proc = type(cfg.inference)(**{**cfg.inference.__dict__, "deterministic": True, "temperature": 0.7})
    raw = type(cfg.inference)(**{**proc.__dict__, "logprobs_mode": "raw"})
    lp_proc = InferenceEngine(policy, proc, seed=0).score_once(roll.tokens, task.prompt_len)
    lp_raw = InferenceEngine(policy, raw, seed=0).score_once(roll.tokens, task.prompt_len)
    assert not torch.allclose(lp_proc, lp_raw)
    one = type(cfg.inference)(**{**proc.__dict__, "temperature": 1.0})
    one_raw = type(cfg.inference)(**{**one.__dict__, "logprobs_mode": "raw"})
    torch.testing.assert_close(InferenceEngine(policy, one, seed=0).score_once(roll.tokens, task.prompt_len),
                               InferenceEngine(policy, one_raw, seed=0).score_once(roll.tokens, task.prompt_len))


def test_perturbation_knobs_change_the_inference_distribution(setup):
    cfg, policy, task, prompts = setup
    tokens = InferenceEngine(policy, cfg.inference, seed=4).generate(prompts, task.answer_len).tokens
    base = type(cfg.inference)(**{**cfg.inference.__dict__, "deterministic": True})
    ref = InferenceEngine(policy, base, seed=0).score_once(tokens, task.prompt_len)
    for knob, value in (("router_noise_sigma", 1.0), ("logit_noise_sigma", 0.5), ("bias_delta", 0.5)):
        icfg = type(base)(**{**base.__dict__, knob: value})
        assert not torch.allclose(InferenceEngine(policy, icfg, seed=0).score_once(tokens, task.prompt_len), ref), knob
    # the biased perturbation is deterministic (bias, no variance); the noise knobs are fresh per call
    biased = InferenceEngine(policy, type(base)(**{**base.__dict__, "bias_delta": 0.5}), seed=0)
    assert biased.score(tokens, task.prompt_len, 3).var(0).max().item() == 0.0
    plain = InferenceEngine(policy, cfg.inference, seed=0).score(tokens, task.prompt_len, 3).var(0).mean().item()
    noisy_cfg = type(cfg.inference)(**{**cfg.inference.__dict__, "logit_noise_sigma": 0.5})
    noisy = InferenceEngine(policy, noisy_cfg, seed=0).score(tokens, task.prompt_len, 3).var(0).mean().item()
    assert noisy > 10 * plain


def test_tasks_reward_partial_and_exact():
    task = Task(load(["task=addition"]).task)  # noqa: E501
    prompts, answers = task.sample(4, torch.Generator().manual_seed(0))
    assert prompts.shape == (4, task.prompt_len) and answers.shape == (4, task.answer_len)
    a = prompts[:, 1:4] @ torch.tensor([100, 10, 1])
    b = prompts[:, 5:8] @ torch.tensor([100, 10, 1])
    assert torch.equal(answers @ torch.tensor([1, 10, 100, 1000]), a + b)  # least significant digit first
    wrong = answers.clone()
    wrong[:, 0] = (wrong[:, 0] + 1) % 10
    r, exact = task.reward(wrong, answers)
    torch.testing.assert_close(r, torch.full((4,), 0.75))
    assert torch.all(exact == 0) and torch.all(task.reward(answers, answers)[1] == 1)


def test_deterministic_mode_freezes_the_noise_knobs(setup):
    cfg, policy, task, prompts = setup
    tokens = InferenceEngine(policy, cfg.inference, seed=5).generate(prompts, task.answer_len).tokens
    base = type(cfg.inference)(**{**cfg.inference.__dict__, "deterministic": True})
    clean = InferenceEngine(policy, base, seed=0).score_once(tokens, task.prompt_len)
    for knob in ("router_noise_sigma", "logit_noise_sigma"):
        eng = InferenceEngine(policy, type(base)(**{**base.__dict__, knob: 0.5}), seed=0)
        scores = eng.score(tokens, task.prompt_len, 3)
        assert scores.var(0).max().item() == 0.0, knob  # no run-to-run variance ...
        assert (scores[0] - clean).abs().mean().item() > 1e-3, knob  # ... but still a perturbation


def test_batched_calls_keep_their_own_split_k_and_match_one_call_each(setup):
    """One batched call over G groups = G separate calls, each with its own (keyed) split-K factor, selected per row
    inside one computation."""
    from harness.backends.local.inference.kernels import SPLITS, _Call

    cfg, _, _, _ = setup
    gen = torch.Generator().manual_seed(0)
    call = _Call(cfg.inference, torch.tensor([3, 4]), 0, 0, groups=6)
    splits = call.splits.tolist()
    assert len(splits) == 12 and len(set(splits)) > 1 and set(splits) <= set(SPLITS)  # the passes differ
    r = call.r
    x, w = r(torch.randn(12, 5, 64, generator=gen)), r(torch.randn(64, 32, generator=gen))
    out = call.mm(x, w)
    for g, s in enumerate(splits):
        assert torch.equal(out[g], call.mm_split(x[g:g + 1], w, s)[0]), g
    by_split = {s: call.mm_split(x[:1], w, s) for s in SPLITS}
    assert not torch.equal(by_split[1], by_split[4])  # split-K changes the bf16 result
    assert out.dtype == torch.bfloat16  # activations are bf16 values
    alone = _Call(cfg.inference, torch.tensor([4]), 0, 0, groups=6)  # seed 4's factors do not depend on its pack
    assert alone.splits.tolist() == splits[6:]
    odd = r(torch.randn(12, 5, 63, generator=gen))  # K not a multiple of 4: split 1 (one matmul) for every row
    assert torch.equal(call.mm(odd, w[:63]), call.mm_split(odd, w[:63], 1))
    det = _Call(type(cfg.inference)(**{**cfg.inference.__dict__, "deterministic": True}), torch.tensor([3, 4]), 0, 0, 6)
    assert det.splits is None and det.draws == 0 and torch.equal(det.mm(x, w), call.mm_split(x, w, 1))


def test_every_engine_call_makes_its_draws_in_one_philox_evaluation_and_a_seed_draws_the_same_in_a_pack(setup):
    """Each forward's draws (split-K, router noise, combine orders, logit noise, the sampled token's Gumbel draws)
    are planned and made at once; a seed's rollout and scorings are bitwise the same alone and in a pack."""
    from harness.backends.local.model import PolicyPack, build_policy

    cfg, _, task, prompts = setup
    icfg = type(cfg.inference)(**{**cfg.inference.__dict__, "router_noise_sigma": 1.0, "logit_noise_sigma": 0.3})
    policies = [build_policy(cfg.model, s) for s in (4, 5)]
    pack = InferenceEngine(PolicyPack.of(policies), icfg, [4, 5])
    pack.score_rows = None  # one call for the pack's scorings (seed by seed: tested below)
    calls = []
    forward = pack._forward
    pack._forward = lambda call, *a, **k: calls.append(call) or forward(call, *a, **k)
    pack.begin_step(3)
    roll = pack.generate(prompts[None].expand(2, -1, -1), task.answer_len)
    scores = pack.score(roll.tokens, task.prompt_len, 3)
    assert [c.call for c in calls] == list(range(task.answer_len + 1)) and all(c.unplanned == 0 for c in calls)
    assert all(not c._ready for c in calls) and {c.draws for c in calls} == {2 * cfg.model.n_layers + 3,
                                                                           2 * cfg.model.n_layers + 2}
    alone = InferenceEngine(policies[1], icfg, 5)
    alone.begin_step(3)
    roll1 = alone.generate(prompts, task.answer_len)
    assert torch.equal(roll1.tokens, roll.tokens[1]) and torch.equal(roll1.logp, roll.logp[1])
    assert torch.equal(alone.score(roll1.tokens, task.prompt_len, 3), scores[1])
    alone.begin_step(4)  # another step: other draws
    assert not torch.equal(alone.score(roll1.tokens, task.prompt_len, 3), scores[1])


def test_split_sums_read_back_on_the_host_give_bitwise_the_per_row_selection(setup):
    """A CPU engine reads each call's split-K factors back and computes only the sums in use (``host``): bitwise
    the per-row selection among all three, for one group (one factor) and for many (several)."""
    from harness.backends.local.inference.kernels import SPLITS, _Call

    cfg, _, _, _ = setup
    gen = torch.Generator().manual_seed(1)
    for seeds, groups in (([3], 1), ([5], 1), ([3, 4], 6)):
        calls = [_Call(cfg.inference, torch.tensor(seeds), 2, 1, groups, host=host) for host in (False, True)]
        x = calls[0].r(torch.randn(len(seeds) * groups, 5, 64, generator=gen))
        w = calls[0].r(torch.randn(64, 32, generator=gen))
        assert torch.equal(calls[0].mm(x, w), calls[1].mm(x, w))
        big = calls[0].r(torch.randn(len(seeds) * groups, 2048, 64, generator=gen))  # factor by factor (gathered)
        assert torch.equal(calls[0].mm(big, w), calls[1].mm(big, w))
        assert calls[0].in_use() == SPLITS and calls[1].in_use() == tuple(sorted(set(calls[1].splits.tolist())))
        assert len(calls[1].in_use()) == (1 if groups == 1 else 3)  # one factor alone; the gathering of several


def test_the_engines_operator_count_does_not_grow_with_the_pack(setup):
    """A rollout and n scorings of a pack are one sequence of operators whatever its size (issue 29's
    device-independent check): no per-seed loop, no grouping of calls by split-K factor on the host."""
    from harness.backends.local.model import PolicyPack, build_policy
    from harness.backends.local.opcount import OpCount

    cfg, _, task, prompts = setup
    icfg = type(cfg.inference)(**{**cfg.inference.__dict__, "router_noise_sigma": 1.0})
    counts = {}
    for size in (1, 6):
        seeds = list(range(size))
        eng = InferenceEngine(PolicyPack.of([build_policy(cfg.model, s) for s in seeds]), icfg, seeds)
        eng.score_rows = None  # the batched path (a GPU's; a CPU scores large packs seed by seed, tested below)
        eng.host_splits = False  # nor reads the split-K factors back (a CPU computes only the sums in use)
        eng.begin_step(0)
        with OpCount() as c:
            roll = eng.generate(prompts[None, :8].expand(size, -1, -1), task.answer_len)
            eng.score(roll.tokens, task.prompt_len, 4)
        counts[size] = c.ops
    assert counts[6] <= 1.05 * counts[1], counts  # the grouped expert GEMM's padding may add a few


def test_a_pack_scored_seed_by_seed_gives_bitwise_the_batched_scorings(setup):
    """A CPU scores a pack's seeds one after the other (cache-sized rows): the same engine call, so the same keyed
    draws and bitwise the same log-probs as the one batched forward a GPU runs."""
    from harness.backends.local.model import PolicyPack, build_policy

    cfg, _, task, prompts = setup
    seeds = [0, 1, 2]
    eng = InferenceEngine(PolicyPack.of([build_policy(cfg.model, s) for s in seeds]), cfg.inference, seeds)
    eng.begin_step(3)
    roll = eng.generate(prompts[None, :8].expand(3, -1, -1), task.answer_len)
    out = {}
    for by_seed in (True, False):
        eng.score_rows = 1 if by_seed else None
        eng.begin_step(4)
        out[by_seed] = eng.score(roll.tokens, task.prompt_len, 4)
    assert torch.equal(out[True], out[False])
    assert not torch.equal(out[True][0, 0], out[True][0, 1])  # the passes differ (noise on)


def test_scoring_keeps_only_the_response_positions_and_matches_a_full_forward(setup):
    """score() skips the last layer's work at prompt positions; deterministic: same log-probs."""
    cfg, policy, task, prompts = setup
    icfg = type(cfg.inference)(**{**cfg.inference.__dict__, "deterministic": True})
    eng = InferenceEngine(policy, icfg, seed=0)
    tokens = eng.generate(prompts, task.answer_len).tokens
    logits, _, _ = eng._forward(eng._call(), tokens, 0, None)
    full = torch.log_softmax(logits[:, task.prompt_len - 1:-1], -1).gather(-1, tokens[:, task.prompt_len:, None])
    assert torch.equal(eng.score_once(tokens, task.prompt_len), full.squeeze(-1))


def test_deterministic_inference_removes_the_noise_and_the_frozen_arm_keeps_it_as_a_bias(setup):
    """At the default router noise (sigma 1): ``deterministic(removed)`` and ``deterministic(frozen)`` both score
    with zero variance, but only ``removed`` is close to the training engine (precision is all that is left);
    the frozen projection is a fixed bias, far larger than the natural engine's mismatch."""
    from harness.spec import EstimatorConfig
    from harness.estimators import build

    cfg, policy, task, prompts = setup
    noisy = type(cfg.inference)(**{**cfg.inference.__dict__, "router_noise_sigma": 1.0})
    tokens = InferenceEngine(policy, noisy, seed=5).generate(prompts, task.answer_len).tokens
    train = TrainEngine(policy).logprobs(tokens, task.prompt_len).logp
    diff = {}
    for noise in ("removed", "frozen"):
        icfg = build(EstimatorConfig("deterministic", noise=noise)).inference(noisy)
        s = InferenceEngine(policy, icfg, seed=0).score(tokens, task.prompt_len, 3)
        assert s.var(0).max().item() == 0.0, noise
        diff[noise] = (s[0] - train).abs().mean().item()
    natural = InferenceEngine(policy, cfg.inference, seed=0).score_once(tokens, task.prompt_len)  # sigma 0, not det.
    assert diff["removed"] < 2 * (natural - train).abs().mean().item()  # no noise source left: the natural gap's size
    assert diff["frozen"] > 5 * diff["removed"]  # 6.5x here (a random-init policy)


def test_sparse_router_noise_hits_a_share_of_router_rows_fresh_per_call_and_planned(setup):
    """``inference.router_noise_rate`` (issue 31's sparse noise): each (token, layer) router row gets the noise with
    probability rate, a keyed Bernoulli per row and call (binomial test at fixed seeds), the other rows are exactly
    the noise-free engine's; the draws are planned (no unplanned Philox call) and a seed's rows are the same alone
    or in a pack."""
    from scipy.stats import binomtest

    from harness.backends.local.inference.kernels import _Call

    cfg, policy, task, prompts = setup
    rate = 0.25
    base = {**cfg.inference.__dict__, "batch_variance": False}
    sparse = type(cfg.inference)(**{**base, "router_noise_sigma": 4.0, "router_noise_rate": rate})
    clean = type(cfg.inference)(**base)
    tokens = InferenceEngine(policy, clean, 0).generate(prompts, task.answer_len).tokens
    hits = []
    for step in (0, 1):
        rl = {}
        for name, icfg in (("sparse", sparse), ("clean", clean)):
            eng = InferenceEngine(policy, icfg, 7)
            call = _Call(icfg, torch.tensor([7]), step, 0, 1, eng.r)
            _, rl[name], _ = eng._forward(call, tokens[None], 0, None)
            assert call.unplanned == 0 and not call._ready
        layer0 = (rl["sparse"][0, ..., 0, :] != rl["clean"][0, ..., 0, :]).any(-1)  # layer 0: the same input
        hits.append(layer0)
    n, k = hits[0].numel(), int(hits[0].sum())
    assert binomtest(k, n, rate).pvalue > 1e-3, (k, n)
    assert not torch.equal(hits[0], hits[1])  # fresh per call: another step hits other rows
    from harness.backends.local.model import PolicyPack
    pack = InferenceEngine(PolicyPack.of([build_policy(cfg.model, 3), policy]), sparse, [3, 7])
    pack.begin_step(2)
    alone = InferenceEngine(policy, sparse, 7)
    alone.begin_step(2)
    in_pack = pack.score(tokens[None].expand(2, -1, -1), task.prompt_len, 2)[1]
    assert torch.equal(in_pack, alone.score(tokens, task.prompt_len, 2))


def test_a_kl_held_scale_multiplies_the_sparse_noise_sigma_and_leaves_its_rows(setup):
    """The KL controller holds issue 31's sparse condition by scaling its sigma (``Noise._sigma``, per seed): the rows
    the Bernoulli hits do not depend on the scale, and on them the router-logit deviation is c times the unscaled one
    (compared after centring each row: log_softmax removes a per-row constant)."""
    from harness.backends.local.inference.kernels import _Call

    cfg, policy, task, prompts = setup
    base = {**cfg.inference.__dict__, "batch_variance": False}
    sparse = type(cfg.inference)(**{**base, "router_noise_sigma": 4.0, "router_noise_rate": 0.25})
    clean = type(cfg.inference)(**base)
    tokens = InferenceEngine(policy, clean, 0).generate(prompts, task.answer_len).tokens
    dev = {}
    for name, icfg, scale in (("clean", clean, None), ("c=1", sparse, None), ("c=0.5", sparse, 0.5)):
        eng = InferenceEngine(policy, icfg, 7)
        eng.scale = None if scale is None else torch.tensor([scale], dtype=torch.float64)
        call = _Call(icfg, torch.tensor([7]), 3, 0, 1, eng.r)
        _, rl, _ = eng._forward(call, tokens[None], 0, None)
        dev[name] = rl[0, ..., 0, :].double()  # layer 0: the same input in every engine
    d1, dh = dev["c=1"] - dev["clean"], dev["c=0.5"] - dev["clean"]
    d1, dh = d1 - d1.mean(-1, keepdim=True), dh - dh.mean(-1, keepdim=True)
    hit1, hith = d1.abs().amax(-1) > 1e-6, dh.abs().amax(-1) > 1e-6
    assert torch.equal(hit1, hith) and 0 < int(hit1.sum()) < hit1.numel()
    assert torch.allclose(dh[hit1], 0.5 * d1[hit1], atol=1e-4, rtol=1e-3)


def test_on_the_bias_only_engine_mean_n_is_the_rollout_log_prob_bitwise(setup):
    """Condition 2 of issue 31 (``v3_bias``: deterministic bf16, no noise): every scoring pass is the sampling pass's
    log-prob bitwise, so mean_n's pi_old (the log-mean-exp of n identical passes) is ``rollout``'s: the two arms train
    identically there and their contrast (H2) is a tie by construction, as mean_n's trend in n (H6)."""
    from harness.estimators.mean_n import log_mean_prob

    cfg, policy, task, prompts = setup
    icfg = type(cfg.inference)(**{**cfg.inference.__dict__, "router_noise_sigma": 0.0, "deterministic": True})
    eng = InferenceEngine(policy, icfg, 0)
    eng.begin_step(0)
    roll = eng.generate(prompts, task.answer_len)
    passes = eng.score(roll.tokens, task.prompt_len, 8)
    assert torch.equal(log_mean_prob(passes), roll.logp)
