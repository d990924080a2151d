"""``tis``: Truncated Importance Sampling against the train-inference mismatch.

    logp_old = logp_rec
    w_t = min(rho_t, C),  rho = pi_rec / pi_roll at token level, or exp(sum_t log rho_t) at
                          sequence level (broadcast over the response)

(Yao et al., "Your efficient RL framework secretly brings you off-policy RL training"; verl's
``rollout_correction.rollout_is`` with a single threshold.) C > 1; w is detached.
On verl: ``rollout_is=<level>``, ``rollout_is_threshold=C``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from harness.estimators.base import Estimator, OldPolicy, Style, Verl, register
from harness.estimators.weights import CappedRatio, importance_ratio

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


def tis_weights(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, clip_c: float, level: str = "token") -> Tensor:
    return importance_ratio(logp_rec, logp_roll, mask, level).clamp(max=clip_c).detach()


@register
class TIS(Estimator):
    name = "tis"
    Params = CappedRatio
    rank = 2
    style = Style("purple", "--")
    camp = "re-weighting"
    verl = Verl(correction=lambda p: {"rollout_is": p.level, "rollout_is_threshold": float(p.clip_c)})

    def old_policy(self, ctx) -> OldPolicy:
        logp_rec = ctx.recompute().logp
        old = self.plain(ctx, logp_rec)
        old.weight = tis_weights(logp_rec, ctx.logp_roll, ctx.mask, self.params.clip_c, self.params.level)
        return old
