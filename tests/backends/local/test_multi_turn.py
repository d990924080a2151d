"""The multi-turn rollout of a tool task (``InferenceEngine.generate_turns``, task ``lookup``) and the response
mask through the trainer: slots, stops, the environment's observation, the KV cache across turns, routing for
every position, and a masked position's log-prob never reaching a metric."""
import dataclasses

import pytest
import torch

from harness import estimators
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import PolicyPack, build_policy
from harness.backends.local.tasks import Task
from harness.backends.local.trainer import LocalTrainer
from harness.spec import InferenceConfig, load
from harness.tasks.vocab import CALL_END, EOS, PAD

EXACT = InferenceConfig(dtype="float32", deterministic=True, batch_variance=False, router_noise_sigma=0.0)  # float32, noiseless


@pytest.fixture(scope="module")
def setup():
    cfg = load(["task=lookup"])
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(64, torch.Generator().manual_seed(0))
    return cfg, policy, task, prompts


def _written(slot: torch.Tensor, stop: int) -> torch.Tensor:
    """1 up to and including the first ``stop`` of each row, then 0 (the tokens the policy sampled)."""
    return ((slot == stop).cumsum(-1) - (slot == stop).long() == 0).float()


def test_turns_stop_per_row_the_environment_answers_and_the_mask_marks_the_sampled_tokens(setup):
    cfg, policy, task, prompts = setup
    tool, n = task.spec.tool, cfg.task.length
    c, o, a = tool.call_len(n), tool.obs_len(n), task.answer_len
    roll = task.rollout(InferenceEngine(policy, cfg.inference, seed=0), prompts)
    p, b = task.prompt_len, prompts.shape[0]
    assert roll.tokens.shape == (b, p + c + o + a) and roll.logp.shape == roll.mask.shape == (b, c + o + a)
    assert torch.equal(roll.tokens[:, :p], prompts)
    call, obs, answer = roll.tokens[:, p:p + c], roll.tokens[:, p + c:p + c + o], roll.tokens[:, p + c + o:]
    stopped = (call == CALL_END).any(-1)
    assert stopped.any() and (~stopped).any() and (answer == EOS).any(-1).any()  # both kinds of rows occur
    want = torch.cat([_written(call, CALL_END), torch.zeros(b, o), _written(answer, EOS)], 1)
    assert torch.equal(roll.mask, want)
    written = torch.cat([call, answer], 1)[torch.cat([want[:, :c], want[:, c + o:]], 1) == 0]
    assert torch.all(written == PAD)  # after a stop: PAD, not sampled
    assert torch.equal(obs, tool.observe(prompts, call))  # the environment's answer to the call as written
    assert torch.all(roll.logp[roll.mask == 0] == 0) and torch.all(roll.logp[roll.mask == 1] < 0)
    assert task.final(roll.tokens).shape == (b, a) and torch.equal(task.final(roll.tokens), answer)


def test_the_observation_joins_the_same_kv_cache_and_every_position_is_routed(setup):
    """float32, noiseless: the sampling log-probs of both turns (decoded through one KV cache, the observation
    prefilled into it) equal a fresh full prefill's, and the recorded experts are those of every position."""
    cfg, policy, task, prompts = setup
    eng = InferenceEngine(policy, EXACT, seed=3)
    roll = task.rollout(eng, prompts)
    m = roll.mask == 1
    fresh = eng.score_once(roll.tokens, task.prompt_len)
    torch.testing.assert_close(roll.logp[m], fresh[m], atol=2e-5, rtol=0)
    mc = cfg.model
    t = roll.tokens.shape[1]
    assert roll.routed_experts.shape == (prompts.shape[0], t, mc.n_layers, mc.top_k)
    assert torch.all(roll.routed_experts[:, -1] == -1) and torch.all(roll.routed_experts[:, :-1] >= 0)
    assert roll.router_logp.shape == (prompts.shape[0], t - task.prompt_len, mc.n_layers, mc.n_experts)
    _, rl, sel = eng._forward(eng._call(), roll.tokens[None, :, :-1], 0, None)
    same = (sel[0].sort(-1).values == roll.routed_experts[:, :-1].sort(-1).values).all(-1).float().mean()
    assert same > 0.99, same  # float32: only exact near-ties may flip between the two orders of computation
    torch.testing.assert_close(roll.router_logp, rl[0, :, task.prompt_len - 1:], atol=1e-4, rtol=0)


def test_a_seed_rolls_out_the_same_alone_or_in_a_pack(setup):
    cfg, policy, task, prompts = setup
    other = build_policy(cfg.model, seed=1)
    alone = task.rollout(InferenceEngine(PolicyPack.of([policy]), cfg.inference, [0]), prompts[None])
    pack = task.rollout(InferenceEngine(PolicyPack.of([policy, other]), cfg.inference, [0, 1]),
                        torch.stack([prompts, prompts]))
    for f in dataclasses.fields(alone):
        assert torch.equal(getattr(alone, f.name)[0], getattr(pack, f.name)[0]), f.name


@pytest.mark.parametrize("name", estimators.NAMES)
def test_a_masked_log_prob_changes_no_metric_of_a_training_step(name, tmp_path):
    """One step of the real trainer on a lookup batch, then the same step again from the same state with the
    sampling log-probs at every masked position set to -inf: every metric but the wall times is bitwise equal."""
    over = {"mean_n": ["estimator.n=2"], "tis": ["estimator.clip_c=2", "estimator.level=sequence"],
            "mis": ["estimator.clip_c=2", "estimator.level=sequence"], "icepop": ["estimator.alpha=0.5",
                                                                                 "estimator.beta=5"],
            "rais": ["estimator.gamma_min=0.8"]}.get(name, [])
    cfg = load(["task=lookup", f"estimator={name}", *over, "trainer.prompts_per_step=4", "trainer.group_size=4",
                "trainer.num_minibatches=2", "diagnostics.noise_sequences=4", "task.warmstart.max_steps=10"])
    trainer = LocalTrainer(cfg, torch.device("cpu"))
    batch = trainer.collect()
    assert (batch.mask == 0).any() and torch.equal(batch.mask, batch.roll.mask)
    state = trainer.state_dict()
    first = trainer.learn(batch)[0]
    trainer.load_state_dict(state)
    roll = dataclasses.replace(batch.roll, logp=batch.roll.logp.masked_fill(batch.mask == 0, float("-inf")))
    again = trainer.learn(dataclasses.replace(batch, roll=roll))[0]
    keys = [k for k in first if not k.startswith(("time/", "tokens/"))]
    assert {k: first[k] for k in keys} == {k: again[k] for k in keys}
