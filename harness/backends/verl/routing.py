"""``moe/routing_flip_rate`` on verl: the rollout's routes (vLLM) against the training engine's (Megatron).

The metric is the catalogue's (``harness.metrics.MOE_ROUTING_FLIP_RATE``, docs/metrics.md): the share of the
policy's response tokens whose top-k expert set differs between rollout and training in any layer, counted at the
position whose forward pass predicts the token, as the local backend computes it
(``harness.backends.local.trainer.routing_flip_rate``).

Where verl 0.9.1 holds the two routings (verl/trainer/ppo/ray_trainer.py, verl/workers/engine/megatron):

* the rollout's: ``batch.batch["routed_experts"]``, [B, T, L, k] int, aligned with ``input_ids`` (left-padded
  prompt, right-padded response; zeros where vLLM recorded nothing), returned by vLLM when
  ``actor_rollout_ref.rollout.enable_rollout_routing_replay=true`` (R3's capture);
* the training engine's: ``routed_experts`` of ``_compute_old_log_prob``'s output, one [n_i, L, k] jagged row per
  sequence over its non-padding tokens, recorded by the Megatron engine when
  ``actor_rollout_ref.actor.megatron.router_replay.mode=R2`` and the batch carries no routes (R2's record).

verl refuses a batch that carries both (its R2/R3 conflict check), so ``plugins/routing.py`` takes the rollout's
routes out of the batch before the old-log-prob pass and compares them with the recorded ones here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: set (to 1) in the environment of a run with ``verl.routing_metrics``: ``plugins/routing.py`` installs its hook
ROUTING_ENV = "HARNESS_ROUTING_METRICS"
#: the route id of a position without a token (padding) in ``padded_routes``
NO_ROUTE = -1


def _rows(routes: Any) -> list[Tensor]:
    """The per-sequence [n_i, L, k] rows of a jagged (nested) tensor or a list of tensors."""
    from torch import Tensor

    if isinstance(routes, Tensor) and routes.is_nested:
        return list(routes.unbind())
    return list(routes)


def padded_routes(routes: Any, attention_mask: Tensor) -> Tensor:
    """The training engine's routes in the rollout's layout: [B, T, L, k] aligned with ``attention_mask`` [B, T],
    row i's routes written at its non-padding positions in order, ``NO_ROUTE`` elsewhere. ``routes``: one
    [n_i, L, k] row per sequence (jagged, verl's R2 record) or already [B, T, L, k] (returned as is)."""
    import torch

    if isinstance(routes, torch.Tensor) and not routes.is_nested and routes.dim() == 4:
        return routes
    rows = _rows(routes)
    if len(rows) != attention_mask.shape[0]:
        raise ValueError(f"{len(rows)} route rows for a batch of {attention_mask.shape[0]} sequences")
    first = rows[0]
    out = torch.full((attention_mask.shape[0], attention_mask.shape[1], *first.shape[1:]), NO_ROUTE,
                     dtype=torch.long, device=first.device)
    for i, row in enumerate(rows):
        positions = attention_mask[i].nonzero().flatten()
        if row.shape[0] != positions.numel():
            raise ValueError(f"sequence {i}: {row.shape[0]} route rows for {positions.numel()} tokens")
        out[i, positions] = row.long()
    return out


def routing_flip_rate(rollout_routes: Tensor, train_routes: Tensor, response_mask: Tensor) -> float:
    """Share of the response tokens (``response_mask`` [B, R] > 0, on the last R positions) whose top-k set differs
    between ``rollout_routes`` and ``train_routes`` ([B, T, L, k], aligned with ``input_ids``) in any layer, read at
    the predicting position of each token (T-R-1 .. T-2, as the local backend's ``[prompt_len - 1:-1]``). Tokens
    with a negative id in either routing (``NO_ROUTE``: no token, or routing unknown) are left out, as the local
    backend leaves out unknown rollout routing; 0.0 when no token is left."""
    r = response_mask.shape[1]
    roll = rollout_routes[:, -r - 1:-1].long().sort(-1).values
    train = train_routes[:, -r - 1:-1].long().sort(-1).values
    flips = (roll != train).any(-1).any(-1).float()
    known = (response_mask > 0) & (roll >= 0).all(-1).all(-1) & (train >= 0).all(-1).all(-1)
    return float((flips * known).sum() / known.sum().clamp(min=1))
