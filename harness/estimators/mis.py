"""``mis``: Masked Importance Sampling - keep the ratio where it is small, drop the rest.

    logp_old = logp_rec
    w = rho * 1[rho <= C]      (sequence level by default, C = 2; token level on request)

A masked sequence (or token) contributes no gradient and leaves the loss denominator, as verl's
rejection sampling does. Equals verl's ``compute_rollout_correction_weights`` with the
threshold ``"1e-9_C"`` (its lower bound below the exp(-20) safety floor, so only C masks).
On verl: ``rollout_is=<level>``, ``rollout_is_threshold="1e-9_C"`` (the weight) and
``rollout_rs=seq_sum_k1|token_k1``, ``rollout_rs_threshold="1/C_inf"`` (the mask:
k1 = -log rho in [log(1/C), +inf)  <=>  rho <= C).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness import metrics as M
from harness.estimators.base import Estimator, OldPolicy, Style, Verl, knob, register
from harness.estimators.weights import CappedRatio, importance_ratio

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: the weight's lower IcePop-style bound on verl: below verl's exp(-20) safety floor, so only C masks
VERL_LOWER = "1e-9"


def mis_weights(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, clip_c: float,
                level: str = "sequence") -> tuple[Tensor, Tensor]:
    """``(w, keep)``: the weight rho * 1[rho <= C] (detached) and keep = 1[rho <= C]."""
    rho = importance_ratio(logp_rec, logp_roll, mask, level)
    keep = (rho <= clip_c).to(rho.dtype)
    return (rho * keep).detach(), keep


def verl_correction(p: CappedRatio) -> dict[str, Any]:
    c = float(p.clip_c)
    return {"rollout_is": p.level, "rollout_is_threshold": f"{VERL_LOWER}_{c!r}",
            "rollout_rs": "token_k1" if p.level == "token" else "seq_sum_k1", "rollout_rs_threshold": f"{1.0 / c!r}_inf"}


@dataclass
class SequenceCap(CappedRatio):
    """MIS's cap, at sequence level by default."""

    level: str = knob("", "token | sequence", default="sequence")


@register
class MIS(Estimator):
    name = "mis"
    Params = SequenceCap
    rank = 3
    style = Style("brown", "--")
    camp = "re-weighting"
    verl = Verl(correction=verl_correction, metrics={"rollout_corr/rollout_rs_masked_fraction": M.IS_MASKED_FRAC})

    def old_policy(self, ctx) -> OldPolicy:
        logp_rec = ctx.recompute().logp
        old = self.plain(ctx, logp_rec)
        old.weight, keep = mis_weights(logp_rec, ctx.logp_roll, ctx.mask, self.params.clip_c, self.params.level)
        old.mask = ctx.mask * keep
        return old
