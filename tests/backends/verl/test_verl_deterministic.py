"""deterministic on verl: each sample gets its own seed and request id (issue 14).

verl's own ``single_turn_agent`` and our ``harness_deterministic`` loop are built for real (verl's
AgentLoopBase with our tiny tokenizer, verl's composed config); only the vLLM server is a fake.
"""
from __future__ import annotations

import asyncio

import torch

from harness.backends.verl import translate

MOE = "model=qwen3_30b_a3b"


class SeededFakeVLLMServer:
    """FAKE of verl's vLLM server under ``full_determinism`` (vLLM needs a GPU). As
    ``vllm_async_server.generate`` does, a request without a seed gets ``replica_rank + rollout.seed``;
    the response is drawn from a generator seeded with the request's seed only, as a batch-invariant
    vLLM with a per-request seed would: same seed and prompt -> same response."""

    def __init__(self, rollout_seed: int, replica_rank: int = 0):
        self.default_seed = replica_rank + rollout_seed
        self.requests: list[tuple[str, int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        seed = sampling_params.setdefault("seed", self.default_seed)
        self.requests.append((request_id, seed))
        g = torch.Generator().manual_seed(seed * 1000003 + sum(prompt_ids))
        tokens = torch.randint(4, 20, (6,), generator=g).tolist()
        return TokenOutput(token_ids=tokens, log_probs=[-1.0] * len(tokens), extra_fields={})


def _loop(cls, vc, tokenizer, server):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return cls(trainer_config=DictConfigWrap(vc), server_manager=server, tokenizer=tokenizer, processor=None,
               dataset_cls=RLHFDataset, data_config=DictConfigWrap(vc.data))


def _group(cls, vc, tokenizer, n: int, prompt: str, first_priority: int = 0):
    """n samples of one prompt as verl's AgentLoopManager issues them (priority = row of the
    repeated batch)."""
    server = SeededFakeVLLMServer(vc.actor_rollout_ref.rollout.seed)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def run_all():
        outs = []
        for i in range(n):
            loop = _loop(cls, vc, tokenizer, server)
            outs.append(await loop.run(dict(params), priority=first_priority + i, index=7,
                                       raw_prompt=[{"role": "user", "content": prompt}]))
        return outs

    outs = asyncio.run(run_all())
    return [tuple(o.response_ids) for o in outs], server.requests


def test_each_sample_gets_its_own_seed_and_request_id(spec, tiny_hf_model, no_hf_network):
    import harness.backends.verl.plugins  # noqa: F401  (registers harness_deterministic)
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from harness.backends.verl.plugins.deterministic import DeterministicAgentLoop, request_id, sample_seed

    cfg = spec("estimator=deterministic", MOE, "seed=3", f"model.path={tiny_hf_model}")
    vc = translate.verl_config(cfg, check=False)
    r = vc.actor_rollout_ref.rollout
    assert r.full_determinism and r.agent.default_agent_loop == "harness_deterministic"
    assert _agent_loop_registry["harness_deterministic"]["_target_"].endswith("DeterministicAgentLoop")
    tok = AutoTokenizer.from_pretrained(tiny_hf_model)
    n = cfg.trainer.group_size

    # verl's own loop: one seed for the whole group and ids that repeat -> n identical responses
    verl_resp, verl_req = _group(SingleTurnAgentLoop, vc, tok, n, "sort 3 1 2")
    assert len({s for _, s in verl_req}) == 1 and len(set(verl_resp)) == 1

    # ours: n seeds, n request ids, n different responses
    resp, req = _group(DeterministicAgentLoop, vc, tok, n, "sort 3 1 2")
    seeds = [s for _, s in req]
    assert len(set(seeds)) == n and len({rid for rid, _ in req}) == n and len(set(resp)) == n
    assert req[2] == (request_id(seeds[2], 2), sample_seed(cfg.seed, 2, 7, [{"role": "user", "content": "sort 3 1 2"}]))

    # every call is reproducible: the same step again gives the same seeds, ids and responses
    assert _group(DeterministicAgentLoop, vc, tok, n, "sort 3 1 2") == (resp, req)
    # another prompt at the same batch rows, or another run seed, draws other seeds
    _, other = _group(DeterministicAgentLoop, vc, tok, n, "sort 9 8 7")
    assert not {s for _, s in other} & set(seeds)
    vc2 = translate.verl_config(spec("estimator=deterministic", MOE, "seed=4", f"model.path={tiny_hf_model}"),
                                check=False)
    _, reseeded = _group(DeterministicAgentLoop, vc2, tok, n, "sort 3 1 2")
    assert not {s for _, s in reseeded} & set(seeds)


def test_non_deterministic_estimators_keep_verls_loop(spec):
    for est, loop in (("tis", "single_turn_agent"), ("mean_n", "harness_mean_n"), ("rollout", "single_turn_agent")):
        vc = translate.verl_config(spec(f"estimator={est}", MOE), check=False)
        assert vc.actor_rollout_ref.rollout.agent.default_agent_loop == loop
    vc = translate.verl_config(spec("estimator=tis", MOE, "inference.deterministic=true"), check=False)
    assert vc.actor_rollout_ref.rollout.agent.default_agent_loop == "harness_deterministic"
