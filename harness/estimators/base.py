"""The estimator interface: how pi_old (the IS denominator) is obtained.

An estimator turns a rollout batch into an :class:`OldPolicy` - the denominator ``logp`` of the
PPO ratio, an extra detached per-token ``weight`` (TIS/MIS/IcePop), a ``mask`` (rejected tokens
contribute no gradient) and an optional routing ``replay`` for the training forwards (R3). It may
also rescale the ratio inside the loss (RAIS). The trainer only calls these hooks; it never looks
at an estimator's name.

Everything an estimator may need is reached through :class:`OldPolicyContext` (lazy, cached,
timed by the trainer), so an estimator pays only for what it uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import EstimatorConfig


@dataclass
class PolicyForward:
    """What a training-engine forward returns for the response tokens of a batch."""

    logp: Tensor  # [B, R] log-prob of each response token
    router_logp: Tensor | None = None  # [B, R, L, E] log router probs at the predicting positions
    selected: Tensor | None = None  # [B, R, L, k] experts used at the predicting positions
    entropy: Tensor | None = None  # [B, R]


@dataclass
class OldPolicy:
    logp: Tensor  # [B, R] IS denominator (detached)
    weight: Tensor  # [B, R] extra detached weight, 1 when the estimator has none
    mask: Tensor  # [B, R] 1 = token contributes to the loss
    replay: Tensor | None = None  # [B, T, L, k] experts to replay in training forwards (-1 = own routing)
    router_logp: Tensor | None = None  # [B, R, L, E] pre-update router log-probs (RAIS)
    selected: Tensor | None = None  # [B, R, L, k] pre-update top-k (RAIS)

    def select(self, idx: Tensor) -> "OldPolicy":
        """The rows ``idx`` of every tensor (a minibatch)."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return OldPolicy(pick(self.logp), pick(self.weight), pick(self.mask), pick(self.replay),
                         pick(self.router_logp), pick(self.selected))


class OldPolicyContext(Protocol):
    """Lazy access to the quantities an estimator may use (see trainer.OldPolicyContext)."""

    logp_roll: Tensor  # [B, R] inference engine's sampling log-prob
    mask: Tensor  # [B, R] response mask
    routed_experts: Tensor | None  # [B, T, L, k] experts the inference engine used

    def recompute(self, replay: Tensor | None = None) -> PolicyForward: ...
    def score(self, n: int) -> Tensor: ...  # [n, B, R] fresh inference scorings


class Estimator:
    """Base class: the denominator is the training engine's recomputed log-prob, weight 1."""

    name: ClassVar[str] = ""
    #: the inference engine must run batch-invariant and fixed-order (costly) for this estimator
    requires_deterministic_inference: ClassVar[bool] = False

    def __init__(self, cfg: "EstimatorConfig"):
        self.cfg = cfg

    def old_policy(self, ctx: OldPolicyContext) -> OldPolicy:
        raise NotImplementedError

    def ratio(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward) -> Tensor:
        """The PPO ratio r = pi_new / pi_old; RAIS rescales it."""
        return torch.exp(logp_new - old.logp)

    # helpers for subclasses
    @staticmethod
    def plain(ctx: OldPolicyContext, logp: Tensor, **kw) -> OldPolicy:
        return OldPolicy(logp=logp.detach(), weight=torch.ones_like(logp), mask=ctx.mask.clone(), **kw)


REGISTRY: dict[str, type[Estimator]] = {}


def register(cls: type[Estimator]) -> type[Estimator]:
    assert cls.name and cls.name not in REGISTRY, cls.name
    REGISTRY[cls.name] = cls
    return cls


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum over the response dimension of the unmasked entries: [B, R] -> [B, 1]."""
    return (x * mask).sum(-1, keepdim=True)


def build(cfg: "EstimatorConfig") -> Estimator:
    from harness import estimators  # noqa: F401  (imports every module, filling REGISTRY)

    return REGISTRY[cfg.name](cfg)


Factory = Callable[["EstimatorConfig"], Estimator]
