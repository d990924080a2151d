"""``moe/routing_flip_rate`` inside verl's trainer (``verl.routing_metrics=true``; harness/backends/verl/routing.py).

With ``verl.routing_metrics`` the translation asks vLLM for its routes (``rollout.enable_rollout_routing_replay``)
and the Megatron engine to record its own in the old-log-prob pass (``router_replay.mode=R2``), and sets
``HARNESS_ROUTING_METRICS=1``. ``install()`` (only then) wraps the legacy trainer's
``RayPPOTrainer._compute_old_log_prob`` in the driver process:

1. it takes the rollout's ``routed_experts`` out of the batch (verl's engine records R2 routes only for a batch
   without routes, and its trainer refuses a step where both are present);
2. runs verl's pass, whose output carries the recorded ``routed_experts`` (R2 then replays those in the update,
   as it does without us);
3. computes the flip rate of the two (``compare``) and keeps it in ``PENDING``, which the tracking plugin's
   ``log`` adds to the step's metrics (``take_pending``): both run in verl's TaskRunner process.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from harness import metrics as M
from harness.backends.verl.routing import ROUTING_ENV, padded_routes, routing_flip_rate

ROUTES = "routed_experts"  # verl's key of the routes, in the rollout's batch and in the old-log-prob output
#: the routing metrics of the step in progress, until the tracking plugin logs them
PENDING: dict[str, float] = {}


def active() -> bool:
    """Whether this process runs a spec with ``verl.routing_metrics`` (its environment says so)."""
    return os.environ.get(ROUTING_ENV) == "1"


def take_rollout_routes(batch: Any) -> Optional[Any]:
    """The rollout's routes, removed from ``batch`` (a verl DataProto); None when it carries none."""
    if ROUTES not in batch.batch.keys():
        return None
    return batch.batch.pop(ROUTES)


def compare(batch: Any, rollout_routes: Any, old_log_prob: Any) -> Optional[float]:
    """``moe/routing_flip_rate`` of one step from the rollout's routes and the old-log-prob output (verl
    DataProtos), kept in ``PENDING``; None (nothing kept) when the training engine recorded no routes."""
    if ROUTES not in old_log_prob.batch.keys():
        return None
    train = padded_routes(old_log_prob.batch[ROUTES], batch.batch["attention_mask"])
    value = routing_flip_rate(rollout_routes, train, batch.batch["response_mask"])
    PENDING[M.MOE_ROUTING_FLIP_RATE] = value
    return value


def take_pending() -> dict[str, float]:
    """The routing metrics computed since the last call (emptied)."""
    out = dict(PENDING)
    PENDING.clear()
    return out


def wrap(orig):
    """``RayPPOTrainer._compute_old_log_prob`` with the routes compared around verl's own pass."""

    def _compute_old_log_prob(self, batch):
        rollout_routes = take_rollout_routes(batch)
        result = orig(self, batch)
        if rollout_routes is not None:
            compare(batch, rollout_routes, result[0])
        return result

    _compute_old_log_prob._harness_routing = True
    return _compute_old_log_prob


def install() -> None:
    """Wrap the legacy trainer's old-log-prob pass (once)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    if getattr(RayPPOTrainer._compute_old_log_prob, "_harness_routing", False):
        return
    RayPPOTrainer._compute_old_log_prob = wrap(RayPPOTrainer._compute_old_log_prob)
