"""``gmpo_rs``: GMPO + router-shift weighting, RSPO's headline method (arXiv 2510.23027, GMPO+RS).

Denominator and router-shift factor as ``rais`` (recompute; gamma from the old top-K router log-probs, floored,
detached), applied to each token ratio before clipping; the objective is GMPO's (arXiv 2507.20673), not PPO's:

    gamma_it = exp( -(1/L) sum_l (1/K) sum_{e in old top-K_l} | log p_l(e) - log p_l_old(e) | )
    l_it     = log(pi_new / pi_rec) + log sg[max(gamma_it, gamma_min)]       (the rescaled token log-ratio)
    S_i      = exp( (1/|o_i|) sum_{t: m=1} s_i min(s_i l_it, s_i clip(l_it, -eps, eps)) ),  s_i = sign(A_i)
    loss     = -(1/B) sum_i S_i A_i

``eps`` is ``log_clip`` (GMPO's 0.4: ratios kept in [exp(-0.4), exp(0.4)]); ``trainer.clip_eps`` is not
read. Masked tokens (padding, observations) leave both the sum and |o_i|. With gamma = 1 this is verl's
``geo_mean`` loss (``tests/estimators/test_gmpo_rs.py``). On verl: policy loss ``harness_gmpo_rs``
(plugins/gmpo_rs.py: verl's ``geo_mean`` on the rescaled ratio), gamma from the same FSDP router patch as rais.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.estimators.base import OldPolicy, PolicyForward, Style, Verl, knob, label_from, register
from harness.estimators.losses import LossTerms, gmpo_terms
from harness.estimators.rais import GAMMA_MIN_ENV, RAIS, RAIS_ENV, Floor, router_shift_gamma, verl_check

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

LOSS_NAME = "harness_gmpo_rs"  # the verl policy loss of plugins/gmpo_rs.py
LOG_CLIP_ENV = "HARNESS_GMPO_LOG_CLIP"


@dataclass
class GeoClip(Floor):
    gamma_min: float = knob("gmin", "floor of gamma, in (0, 1]; 1 = no router shift (gamma <= 1): plain GMPO", default=0.8)
    log_clip: float = knob("eps", "GMPO's clip range in log space: token ratios kept in [exp(-eps), exp(eps)]; > 0",
                            default=0.4)

    def validate(self) -> None:
        super().validate()
        if not (0 < self.log_clip and math.isfinite(self.log_clip)):
            raise ConfigError("estimator.log_clip", f"must be a finite number > 0, got {self.log_clip}")


def rescaled_log_ratio(logp_new: Tensor, old: OldPolicy, new: PolicyForward, gamma_min: float) -> Tensor:
    """l = log(pi_new / pi_old) + log max(gamma, gamma_min), gamma detached (0 added where routing is unchanged)."""
    gamma = router_shift_gamma(new.router_logp, old.router_logp, old.selected)
    return logp_new - old.logp + gamma.detach().clamp(min=gamma_min).log()


@register
class GMPORS(RAIS):
    name = "gmpo_rs"
    Params = GeoClip
    rank = 7
    style = Style("navy", "-.")
    camp = "re-weighting"
    verl = Verl(loss_mode=LOSS_NAME, check=verl_check,
                env=lambda p: {GAMMA_MIN_ENV: repr(float(p.gamma_min)), LOG_CLIP_ENV: repr(float(p.log_clip)),
                               RAIS_ENV: "1"})

    @classmethod
    def label(cls, values) -> str:
        """``gmpo(eps=0.4)`` when ``gamma_min`` is 1 (gamma <= 1 is floored away: plain GMPO, no router shift), else
        ``gmpo_rs(gmin=0.8,eps=0.4)`` (``gmpo_rs(eps=0.4)`` where the floor is not known: runs that did not tag it)."""
        try:
            gmin = float(values.get("gamma_min"))  # a number, or its text ("1.0")
        except (TypeError, ValueError):
            gmin = None
        if gmin == 1.0:
            return label_from("gmpo", [("eps", values.get("log_clip"))])
        return super().label(values)

    def loss(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward, adv: Tensor, clip_eps: float) -> LossTerms:
        """GMPO's per-sequence terms of the rescaled log-ratios (aggregated seq-mean); ``clip_eps`` (PPO's) is not
        used."""
        log_ratio = rescaled_log_ratio(logp_new, old, new, self.params.gamma_min)
        return gmpo_terms(log_ratio, adv, old.mask, self.params.log_clip)
