"""Our code inside verl: the ``harness_rais`` and ``harness_gmpo_rs`` policy losses and the ``harness_mean_n``
agent loop.

They run here on CPU tensors through verl's own entry points (``get_policy_loss_fn``, verl's
vanilla PPO loss, verl's AgentLoopOutput) and must give the local backend's numbers
(``harness.estimators``, ``harness.backends.local.trainer.ppo_loss``) on the same inputs.
The one fake is ``FakeVLLMServer``: verl's vLLM rollout server cannot run without vLLM/GPUs.
"""
from __future__ import annotations

import asyncio
import os

import pytest
import torch

from harness.backends.local.agg import agg_loss
from harness.backends.local.trainer import ppo_loss as local_ppo_loss
from harness.estimators.mean_n import log_mean_prob
from harness.estimators import rais
from harness.estimators.rais import rais_ratio, router_shift_gamma

from harness.backends.verl import translate

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

B, R, L, E, K = 6, 9, 3, 8, 4


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, R, generator=g, dtype=torch.float64) * 2
    logp_new = logp_old + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, R).contiguous()
    mask = (torch.arange(R) < torch.randint(2, R + 1, (B, 1), generator=g)).to(torch.float64)
    return g, logp_old, logp_new, adv, mask


def _actor_config(spec, estimator: str, *extra: str):
    """verl's ActorConfig dataclass for our translated spec (clip eps, dual clip off, loss mode)."""
    from verl.utils.config import omega_conf_to_dataclass

    args = (["verl.experimental_rais=true", "model=qwen3_30b_a3b_fsdp"] if estimator in ("rais", "gmpo_rs")
            else ["model=qwen3_30b_a3b"])
    cfg = spec(f"estimator={estimator}", *args, *extra)
    vc = translate.verl_config(cfg, check=False)
    return cfg, omega_conf_to_dataclass(vc.actor_rollout_ref.actor)


def test_rais_loss_in_verl_equals_local_backend(spec):
    import harness.backends.verl.plugins  # noqa: F401
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    cfg, actor = _actor_config(spec, "rais", "trainer.clip_eps=0.2", "estimator.gamma_min=0.8")
    loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    g, logp_old, logp_new, adv, mask = _batch()
    router_old = torch.log_softmax(torch.randn(B, R, L, E, generator=g, dtype=torch.float64), -1)
    router_new = torch.log_softmax(router_old + torch.randn(B, R, L, E, generator=g, dtype=torch.float64) * 0.4, -1)
    topk = router_old.topk(K, -1).indices
    gamma = router_shift_gamma(router_new, router_old, topk)
    assert (gamma < 0.8).any() and (gamma > 0.8).any()  # both sides of the floor are exercised

    loss, metrics = loss_fn(old_log_prob=logp_old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(),
                            loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None,
                            router_shift_gamma=gamma, gamma_min=cfg.estimator.gamma_min)
    ratio = rais_ratio(torch.exp(logp_new - logp_old), gamma, cfg.estimator.gamma_min)
    want, _ = local_ppo_loss(ratio, adv, torch.ones_like(mask), mask, cfg.trainer.clip_eps)
    torch.testing.assert_close(loss, want)

    # gamma gathered at the old top-K (what verl's engine would hand over) gives the same gamma
    from harness.backends.verl.plugins.rais import gamma_from_router, router_shift

    gathered = gamma_from_router(router_new.gather(-1, topk), router_old.gather(-1, topk))
    torch.testing.assert_close(gathered, gamma)
    # and the context-variable route (no extra kwargs through verl's ppo_loss) gives the same loss
    os.environ[rais.GAMMA_MIN_ENV] = "0.8"
    try:
        with router_shift(gamma):
            loss2, _ = loss_fn(old_log_prob=logp_old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(),
                               loss_agg_mode=actor.loss_agg_mode, config=actor)
    finally:
        del os.environ[rais.GAMMA_MIN_ENV]
    torch.testing.assert_close(loss2, want)
    assert metrics["actor/rais_gamma_floor_frac"] > 0


def test_gmpo_rs_loss_in_verl_equals_local_backend(spec, monkeypatch):
    """``harness_gmpo_rs`` (verl's geo_mean on the router-shifted ratio, clip from the estimator's log_clip, not
    the actor's clip_ratio) against the local estimator's loss hook on the same tensors, both routes of gamma."""
    import harness.backends.verl.plugins  # noqa: F401
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from harness.backends.verl.plugins.rais import router_shift
    from harness.estimators import OldPolicy, PolicyForward, build
    from harness.estimators.gmpo_rs import LOG_CLIP_ENV

    cfg, actor = _actor_config(spec, "gmpo_rs", "estimator.log_clip=0.3")
    assert actor.policy_loss.loss_mode == "harness_gmpo_rs" and actor.clip_ratio == cfg.trainer.clip_eps != 0.3
    loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    g, logp_old, logp_new, adv, mask = _batch(1)
    router_old = torch.log_softmax(torch.randn(B, R, L, E, generator=g, dtype=torch.float64), -1)
    router_new = torch.log_softmax(router_old + torch.randn(B, R, L, E, generator=g, dtype=torch.float64) * 0.4, -1)
    topk = router_old.topk(K, -1).indices
    gamma = router_shift_gamma(router_new, router_old, topk)
    assert (gamma < 0.8).any() and (gamma > 0.8).any()

    est = build(cfg.estimator)
    old = OldPolicy(logp_old, torch.ones_like(mask), mask, router_logp=router_old, selected=topk)
    want, _ = agg_loss(est.loss(logp_new, old, PolicyForward(logp_new, router_logp=router_new), adv[:, :1], 0.2),
                       old.mask, 1)
    loss, metrics = loss_fn(old_log_prob=logp_old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(),
                            loss_agg_mode=actor.loss_agg_mode, config=actor, router_shift_gamma=gamma,
                            gamma_min=0.8, log_clip=0.3)
    torch.testing.assert_close(loss, want[0])
    assert metrics["actor/rais_gamma_floor_frac"] > 0 and metrics["actor/pg_clipfrac"] > 0
    for k, v in translate.verl_config(cfg, check=False).ray_kwargs.ray_init.runtime_env.env_vars.items():
        monkeypatch.setenv(k, v)  # the workers' environment, as translate.py sets it: HARNESS_GMPO_LOG_CLIP=0.3
    assert os.environ[LOG_CLIP_ENV] == "0.3" and os.environ[rais.GAMMA_MIN_ENV] == "0.8"
    with router_shift(gamma):
        loss2, _ = loss_fn(old_log_prob=logp_old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(),
                           loss_agg_mode=actor.loss_agg_mode, config=actor)
    torch.testing.assert_close(loss2, want[0])
    with pytest.raises(RuntimeError, match="router"):
        loss_fn(old_log_prob=logp_old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(), config=actor)


def test_rais_loss_refuses_to_run_without_router_information(spec):
    import harness.backends.verl.plugins  # noqa: F401
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    _, actor = _actor_config(spec, "rais")
    _, logp_old, logp_new, adv, mask = _batch()
    with pytest.raises(RuntimeError, match="router"):
        get_policy_loss_fn("harness_rais")(old_log_prob=logp_old, log_prob=logp_new, advantages=adv,
                                           response_mask=mask.bool(), loss_agg_mode="token-mean", config=actor)


class FakeVLLMServer:
    """FAKE of verl's vLLM rollout server (``LLMServerClient.generate``), which needs vLLM and a GPU.

    A scoring request returns ``extra_fields["prompt_logprobs"]`` in the layout of verl's
    ``vllm_rollout.utils.extract_prompt_logprobs``: one row per token 1..S-1 (the log-prob of that
    token given the ones before it), then a dummy row. Each call adds fresh noise, as repeated vLLM
    passes differ; ``calls`` records the true per-call values.
    """

    def __init__(self, seed: int = 0, sigma: float = 0.2):
        self.g = torch.Generator().manual_seed(seed)
        self.sigma = sigma
        self.calls: list[list[float]] = []

    def _logp(self, prev: int, tok: int) -> float:
        return -0.1 - ((prev * 7 + tok * 3) % 11) / 5.0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        assert sampling_params["prompt_logprobs"] == 0 and sampling_params["max_tokens"] == 1
        noise = torch.randn(len(prompt_ids), generator=self.g) * self.sigma
        rows = [[self._logp(prompt_ids[j - 1], prompt_ids[j]) + float(noise[j])] for j in range(1, len(prompt_ids))]
        self.calls.append([r[0] for r in rows])
        return TokenOutput(token_ids=[0], log_probs=None, extra_fields={"prompt_logprobs": rows + [[0.0]],
                                                                        "prompt_ids": [[0]] * len(prompt_ids)})


def test_mean_n_rescoring_equals_local_log_mean_prob():
    from harness.backends.verl.plugins.mean_n import mean_n_logprobs, score_response

    server = FakeVLLMServer()
    prompt, response, n = [5, 3, 9, 1], [2, 7, 7, 4, 0], 8
    scores = asyncio.run(score_response(server, prompt, response, n))
    assert scores.shape == (n, len(response))
    want_rows = torch.tensor([c[len(prompt) - 1: len(prompt) - 1 + len(response)] for c in server.calls], dtype=torch.float64)
    torch.testing.assert_close(scores, want_rows)
    # the noiseless part of the rows is the response tokens' log-probs: the alignment is right
    clean = [server._logp(p, t) for p, t in zip([prompt[-1], *response[:-1]], response)]
    assert (scores.mean(0) - torch.tensor(clean, dtype=torch.float64)).abs().max() < 0.5
    torch.testing.assert_close(torch.tensor(mean_n_logprobs(scores), dtype=torch.float64), log_mean_prob(scores))


def test_an_aborted_scoring_pass_is_named_not_taken_for_another_server():
    """verl's vLLM server answers a request it aborted (pause_generation) with stop_reason="aborted" and no
    prompt_logprobs: the error says so (not "needs verl's vLLM server"), and the pass is not retried."""
    from verl.workers.rollout.replica import TokenOutput

    from harness.backends.verl.plugins.mean_n import score_response

    class Aborting(FakeVLLMServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            if len(self.calls) == 1:
                self.calls.append([])
                return TokenOutput(token_ids=[], stop_reason="aborted", extra_fields={"global_steps": 7})
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    server = Aborting()
    with pytest.raises(RuntimeError, match=r"aborted by the rollout server \(global step 7\)"):
        asyncio.run(score_response(server, [5, 3, 9, 1], [2, 7, 7], 4))
    assert len(server.calls) == 2  # the second pass aborted; no retry, no third


def test_mean_n_agent_loop_replaces_rollout_logprobs(spec):
    """verl's AgentLoopOutput through our loop's rescoring step: response_logprobs (what verl's bypass
    mode uses as old_log_probs) become log_mean_prob of the n passes; the sampling ones are kept."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from harness.backends.verl.plugins.mean_n import MeanNAgentLoop

    cfg = spec("estimator=mean_n", "estimator.n=6", "model=qwen3_30b_a3b")
    loop = object.__new__(MeanNAgentLoop)  # skip verl's tokenizer/server setup: rescore needs neither
    loop.config = OmegaConf.create({"harness": {"mean_n": cfg.estimator.n}})
    loop.server_manager = FakeVLLMServer(seed=3)
    sampled = [-0.5, -1.0, -0.2]
    out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 1], response_logprobs=sampled,
                          metrics=AgentLoopMetrics())
    out = asyncio.run(loop.rescore(out, {"temperature": 1.0}))
    calls = torch.tensor([c[1:4] for c in loop.server_manager.calls], dtype=torch.float64)
    assert calls.shape == (6, 3)
    torch.testing.assert_close(torch.tensor(out.response_logprobs, dtype=torch.float64), log_mean_prob(calls))
    assert out.extra_fields["harness_sampling_logprobs"] == sampled
    assert out.as_dict()["rollout_log_probs"].shape == (3,)
    # greedy validation samples are left alone
    val = AgentLoopOutput(prompt_ids=[1], response_ids=[3], response_mask=[1], response_logprobs=[-0.1],
                          metrics=AgentLoopMetrics())
    assert asyncio.run(loop.rescore(val, {"temperature": 0})).response_logprobs == [-0.1]


def test_mean_n_old_logprob_in_verls_loss_equals_local(spec):
    """bypass mode feeds the agent loop's log-probs to verl's vanilla loss as old_log_prob."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    cfg, actor = _actor_config(spec, "mean_n", "estimator.n=4")
    g, _, logp_new, adv, mask = _batch(1)
    scores = logp_new.unsqueeze(0) + torch.randn(4, B, R, generator=g, dtype=torch.float64) * 0.3
    old = log_mean_prob(scores)
    loss, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=logp_new, advantages=adv, response_mask=mask.bool(),
        loss_agg_mode=actor.loss_agg_mode, config=actor)
    want, _ = local_ppo_loss(torch.exp(logp_new - old), adv, torch.ones_like(mask), mask, cfg.trainer.clip_eps)
    torch.testing.assert_close(loss, want)


class StepFakeVLLMServer(FakeVLLMServer):
    """FAKE vLLM server (as FakeVLLMServer) whose requests take one engine 'step' (an event-loop turn):
    it records which requests are in flight together, i.e. would share an engine step's batch. ``step_s``: how
    long the step lasts (0: one event-loop turn)."""

    step_s = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight: list[tuple[str, tuple]] = []
        self.batches: list[list[tuple]] = []
        self.ids: list[str] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.ids.append(request_id)
        entry = (request_id, tuple(prompt_ids))
        self.in_flight.append(entry)
        self.batches.append([seq for _, seq in self.in_flight])
        await asyncio.sleep(self.step_s)  # the engine step: every request sent before it is batched with this one
        self.in_flight.remove(entry)
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)


def test_mean_n_passes_of_a_response_never_share_an_engine_step():
    """Identical requests in one vLLM batch compute identically (plugins/mean_n.py): the n passes of a
    response go one after the other, while different responses are scored concurrently."""
    from harness.backends.verl.plugins.mean_n import score_response

    server, n = StepFakeVLLMServer(), 4
    responses = [([5, 3], [2, 7, 1]), ([5, 3], [4, 4, 0]), ([9, 1], [2, 2, 2])]

    async def score_all():
        return await asyncio.gather(*(score_response(server, p, r, n) for p, r in responses))

    scores = asyncio.run(score_all())
    assert [s.shape for s in scores] == [(n, 3)] * 3 and len(server.ids) == n * len(responses)
    assert len(set(server.ids)) == len(server.ids)  # a fresh request id per pass (the router may move it)
    assert max(len(b) for b in server.batches) > 1  # responses overlap...
    for b in server.batches:
        assert len(b) == len(set(b))  # ...but never two passes of the same sequence in one step
