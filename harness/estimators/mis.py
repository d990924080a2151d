"""``mis``: Masked Importance Sampling - keep the ratio where it is small, drop the rest.

    logp_old = logp_rec
    w = rho * 1[rho <= C]      (sequence level by default, C = 2; token level on request)

A masked sequence (or token) contributes no gradient and leaves the loss denominator, as verl's
rejection sampling does. Equals verl's ``compute_rollout_correction_weights`` with the
threshold ``"1e-9_C"`` (its lower bound below the exp(-20) safety floor, so only C masks).
"""
from torch import Tensor

from harness.estimators.base import Estimator, OldPolicy, register
from harness.estimators.weights import importance_ratio


def mis_weights(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, clip_c: float, level: str = "sequence") -> Tensor:
    rho = importance_ratio(logp_rec, logp_roll, mask, level)
    return (rho * (rho <= clip_c)).detach()


@register
class MIS(Estimator):
    name = "mis"

    def old_policy(self, ctx) -> OldPolicy:
        logp_rec = ctx.recompute().logp
        rho = importance_ratio(logp_rec, ctx.logp_roll, ctx.mask, self.cfg.level)
        keep = (rho <= self.cfg.clip_c).to(rho.dtype)
        old = self.plain(ctx, logp_rec)
        old.weight = (rho * keep).detach()
        old.mask = ctx.mask * keep
        return old
