"""``icepop``: token-level IS that zeroes the weight outside a band (IcePop, Ling team).

    logp_old = logp_rec
    k_t = pi_rec / pi_roll;   w_t = k_t if alpha <= k_t <= beta else 0      (alpha 0.5, beta 5)

Out-of-band tokens get weight 0 but stay in the loss denominator, exactly as verl's
``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold="alpha_beta")``,
which is its verl mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness import metrics as M
from harness.errors import ConfigError
from harness.estimators.base import Estimator, OldPolicy, Params, Style, Verl, knob, register
from harness.estimators.weights import importance_ratio

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


def icepop_weights(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, alpha: float, beta: float) -> Tensor:
    k = importance_ratio(logp_rec, logp_roll, mask, "token")
    return (k * ((k >= alpha) & (k <= beta))).detach()


@dataclass
class Band(Params):
    alpha: float = knob(None, "lower bound of the band, in (0, 1)", default=0.5)
    beta: float = knob(None, "upper bound of the band, > 1", default=5.0)

    def validate(self) -> None:
        if not 0 < self.alpha < 1 < self.beta:
            raise ConfigError("estimator.alpha", f"need 0 < alpha < 1 < beta, got alpha={self.alpha}, beta={self.beta}")


@register
class IcePop(Estimator):
    name = "icepop"
    Params = Band
    rank = 4
    style = Style("pink", "-.")
    camp = "re-weighting"
    verl = Verl(correction=lambda p: {"rollout_is": "token",
                                      "rollout_is_threshold": f"{float(p.alpha)!r}_{float(p.beta)!r}"},
                metrics={"rollout_corr/rollout_is_oob_ratio": M.IS_MASKED_FRAC})

    def old_policy(self, ctx) -> OldPolicy:
        logp_rec = ctx.recompute().logp
        old = self.plain(ctx, logp_rec)
        old.weight = icepop_weights(logp_rec, ctx.logp_roll, ctx.mask, self.params.alpha, self.params.beta)
        return old
