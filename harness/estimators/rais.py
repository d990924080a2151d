"""``rais``: Router-Aware Importance Sampling (RSPO) - shrink the ratio when routing has shifted.

    gamma = exp( -(1/L) sum_l (1/K) sum_{e in old top-K_l} | log p_l(e) - log p_l_old(e) | )
    r'    = r * max(gamma, gamma_min)          (gamma detached; applied before PPO clipping)

``p_l`` are the current router probabilities of layer l at the token's predicting position,
``p_l_old`` those under the pre-update weights (from the recompute forward), and the K experts are
the old top-K. Denominator: logp_rec. gamma = 1 while routing is unchanged; gamma_min = 0.8.
On verl: policy loss ``harness_rais`` (plugins/rais.py), decoupled mode, FSDP engine with our router
patch (plugins/rais_fsdp.py, active where ``HARNESS_RAIS=1``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.estimators.base import Estimator, Needs, OldPolicy, Params, PolicyForward, Style, Verl, knob, register

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

LOSS_NAME = "harness_rais"  # the verl policy loss of plugins/rais.py
RAIS_ENV = "HARNESS_RAIS"  # set for rais runs: the FSDP engine patch records router logits
GAMMA_MIN_ENV = "HARNESS_RAIS_GAMMA_MIN"


def router_shift_gamma(router_logp_new: Tensor, router_logp_old: Tensor, old_topk: Tensor) -> Tensor:
    """gamma per token. router_logp_*: [..., L, E]; old_topk: [..., L, K] expert indices."""
    new = router_logp_new.gather(-1, old_topk)
    old = router_logp_old.gather(-1, old_topk)
    return (-(new - old).abs().mean(-1).mean(-1)).exp()


def rais_ratio(ratio: Tensor, gamma: Tensor, gamma_min: float) -> Tensor:
    """r * max(gamma, gamma_min), gamma detached."""
    return ratio * gamma.detach().clamp(min=gamma_min)


@dataclass
class Floor(Params):
    gamma_min: float = knob(None, "floor of gamma, in (0, 1]", default=0.8)

    def validate(self) -> None:
        if not 0 < self.gamma_min <= 1:
            raise ConfigError("estimator.gamma_min", f"must be in (0, 1], got {self.gamma_min}")


def verl_check(cfg) -> None:
    """The router-shift estimators (rais, gmpo_rs) on verl: FSDP engine, packed forward, experimental flag."""
    v, name = cfg.verl, cfg.estimator.name
    if v.strategy not in ("fsdp", "fsdp2"):
        raise ConfigError("estimator", f"{name} on verl runs on the FSDP engine only (our patch of its forward records "
                          f"the HF Qwen3-MoE router logits, plugins/rais_fsdp.py); verl.strategy={v.strategy} has no "
                          "such patch: verl's megatron engine gives policy losses no router log-probs. "
                          "Use model=qwen3_30b_a3b_fsdp (FSDP2)")
    if not v.parallel.use_remove_padding:
        raise ConfigError("verl.parallel.use_remove_padding",
                          f"{name} on verl reads the router logits of the packed (remove-padding) forward: set it true")
    if not v.experimental_rais:
        raise ConfigError("estimator", f"{name} on verl: the FSDP router patch and its policy loss are tested on "
                          "CPU with a tiny HF Qwen3-MoE but have not run on a GPU (docs/verl.md, 'RAIS'). "
                          "Set verl.experimental_rais=true")


@register
class RAIS(Estimator):
    name = "rais"
    Params = Floor
    needs = Needs(router=True)
    rank = 7
    style = Style("olive", "-.")
    camp = "re-weighting"
    verl = Verl(loss_mode=LOSS_NAME, env=lambda p: {GAMMA_MIN_ENV: repr(float(p.gamma_min)), RAIS_ENV: "1"},
                check=verl_check)

    def old_policy(self, ctx) -> OldPolicy:
        fwd = ctx.recompute()
        if fwd.router_logp is None:
            raise ValueError("rais needs router probabilities; this model has no router (dense)")
        return self.plain(ctx, fwd.logp, router_logp=fwd.router_logp, selected=fwd.selected)

    def ratio(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward) -> Tensor:
        gamma = router_shift_gamma(new.router_logp, old.router_logp, old.selected)
        return rais_ratio((logp_new - old.logp).exp(), gamma, self.params.gamma_min)
