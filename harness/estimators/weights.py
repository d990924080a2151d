"""Importance ratios between the training engine and the inference engine's sampling pass.

    log rho_t = logp_rec_t - logp_roll_t                                  (token level)
    log rho   = sum_t mask_t (logp_rec_t - logp_roll_t), broadcast over t  (sequence level)

clamped to +-20 before exponentiating (verl's SAFETY_BOUND) and zeroed on padding (and on observation tokens of a
multi-turn rollout: mask_t = 0; whatever log-probs stand there, even non-finite ones, are never read), exactly as
``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights`` does, so TIS, MIS and
IcePop agree with verl's functions on the same tensors (tests/estimators/test_verl_parity.py).
:class:`CappedRatio` is the parameter set of the ratio estimators with a cap C (TIS, MIS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError, one_of
from harness.estimators.base import Params, knob

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

SAFETY_BOUND = 20.0
LEVELS = ("token", "sequence")


def importance_ratio(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, level: str) -> Tensor:
    log_ratio = (logp_rec - logp_roll).masked_fill(mask == 0, 0.0)  # a masked position is never read
    if level == "token":
        rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    elif level == "sequence":
        total = (log_ratio * mask).sum(-1, keepdim=True)
        rho = total.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio)
    else:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return rho * mask


@dataclass
class CappedRatio(Params):
    """A cap C > 1 on the ratio rho, at token or sequence level."""

    clip_c: float = knob("C", "the cap C", axis=True, default=2.0)
    level: str = knob("", "token | sequence", default="token")

    def validate(self) -> None:
        if not self.clip_c > 1:
            raise ConfigError("estimator.clip_c", f"the cap C must be > 1, got {self.clip_c}")
        one_of(self.level, LEVELS, "estimator.level")
