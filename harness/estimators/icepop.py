"""``icepop``: token-level IS that zeroes the weight outside a band (IcePop, Ling team).

    logp_old = logp_rec
    k_t = pi_rec / pi_roll;   w_t = k_t if alpha <= k_t <= beta else 0      (alpha 0.5, beta 5)

Out-of-band tokens get weight 0 but stay in the loss denominator, exactly as verl's
``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold="alpha_beta")``.
"""
from torch import Tensor

from harness.estimators.base import Estimator, OldPolicy, register
from harness.estimators.weights import importance_ratio


def icepop_weights(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, alpha: float, beta: float) -> Tensor:
    k = importance_ratio(logp_rec, logp_roll, mask, "token")
    return (k * ((k >= alpha) & (k <= beta))).detach()


@register
class IcePop(Estimator):
    name = "icepop"

    def old_policy(self, ctx) -> OldPolicy:
        logp_rec = ctx.recompute().logp
        old = self.plain(ctx, logp_rec)
        old.weight = icepop_weights(logp_rec, ctx.logp_roll, ctx.mask, self.cfg.alpha, self.cfg.beta)
        return old
