"""``deterministic`` inside verl: a seed and a request id per sample (agent loop ``harness_deterministic``).

verl 0.9.1 under ``rollout.full_determinism`` gives every request of a replica the same vLLM seed
(``vllm_async_server.py``: ``setdefault("seed", replica_rank + seed)``) and the request id
``det-{priority}``. With a batch-invariant vLLM the n responses of a prompt then come out
identical (zero GRPO advantage), and the ids repeat every step (sticky routing by id). This loop is
verl's ``single_turn_agent`` with, per sample,

    seed       = int(sha256(rollout.seed, priority, index, prompt)[:8 bytes]) mod 2^31
    request_id = "harness-det-{seed}-{priority}"

``priority`` is the sample's row in the step's batch (verl's ``AgentLoopManager`` assigns
``arange`` over the already repeated batch), so the n samples of a prompt get n seeds; the same
step of the same run (a resumed one too) gets the same seeds, as the same prompts come in the same
order. vLLM samples with a per-request generator when a seed is given, so the draw does not depend
on which replica or batch serves it; ``setdefault`` keeps our seed.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

AGENT_LOOP_NAME = "harness_deterministic"
SEED_MOD = 2 ** 31


def sample_seed(base_seed: int, priority: int, index: Any = None, prompt: Any = None) -> int:
    """The vLLM seed of one sample (formula in the module docstring)."""
    key = json.dumps([int(base_seed), int(priority), None if index is None else str(index),
                      None if prompt is None else _plain(prompt)], sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % SEED_MOD


def request_id(seed: int, priority: int) -> str:
    return f"harness-det-{seed}-{int(priority)}"


def _plain(x: Any) -> Any:
    """numpy arrays / dict-likes from verl's non_tensor_batch as JSON-able Python values."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


class _FixedRequestId:
    """The loop's server client with the request id of every ``generate`` call replaced by ours."""

    def __init__(self, inner: Any, rid: str):
        self._inner, self._rid = inner, rid

    async def generate(self, request_id: str, **kwargs):  # noqa: ARG002  (verl's id is replaced)
        return await self._inner.generate(request_id=self._rid, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register  # noqa: E402
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402


@register(AGENT_LOOP_NAME)
class DeterministicAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn loop with a per-sample seed and request id (module docstring)."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        seed = sample_seed(self.rollout_config.seed, int(priority), kwargs.get("index"), kwargs.get("raw_prompt"))
        server = self.server_manager
        self.server_manager = _FixedRequestId(server, request_id(seed, int(priority)))
        try:
            return await super().run({**sampling_params, "seed": seed}, priority=priority, **kwargs)
        finally:
            self.server_manager = server
