"""``Rollout``: what the engine's generation returns (``generate``, ``generate_turns``): the tokens, their sampling
log-probs, the routing recorded per position and, in a multi-turn rollout, the mask of the sampled tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rollout:
    tokens: Tensor  # [B, T] prompt + response
    logp: Tensor  # [B, R] sampling log-probs
    routed_experts: Tensor | None  # [B, T, L, k], -1 at the last position (never processed)
    router_logp: Tensor | None  # [B, R, L, E] router log-probs at the predicting positions
    mask: Tensor | None = None  # [B, R] 1 = a token the policy sampled (multi-turn only; None = all)
    # [B, T] int8, multi-turn MoE only: where each position's recorded routing comes from (prefix_cache.SAMPLED,
    # RECOMPUTED_SAME, RECOMPUTED_OTHER after a prefix-cache miss, MISSING with replay_on_miss=missing)
    routing_origin: Tensor | None = None

    def map(self, fn) -> "Rollout":
        """The rollout with ``fn`` applied to every tensor field (None stays None)."""
        return Rollout(*(None if v is None else fn(v) for v in (self.tokens, self.logp, self.routed_experts,
                                                                 self.router_logp, self.mask, self.routing_origin)))


def routing(routed: list[Tensor], routers: list[Tensor]) -> tuple[Tensor | None, Tensor | None]:
    """(routed experts [S, B, T, L, k] with -1 at the last position, router log-probs [S, B, R, L, E]) of
    the recorded forwards, or (None, None) for a dense model."""
    if not routed:
        return None, None
    last = torch.full_like(routed[0][:, :, :1], -1)
    return torch.cat(routed + [last], 2), torch.cat(routers, 2)
