"""``rais``: Router-Aware Importance Sampling (RSPO) - shrink the ratio when routing has shifted.

    gamma = exp( -(1/L) sum_l (1/K) sum_{e in old top-K_l} | log p_l(e) - log p_l_old(e) | )
    r'    = r * max(gamma, gamma_min)          (gamma detached; applied before PPO clipping)

``p_l`` are the current router probabilities of layer l at the token's predicting position,
``p_l_old`` those under the pre-update weights (from the recompute forward), and the K experts are
the old top-K. Denominator: logp_rec. gamma = 1 while routing is unchanged; gamma_min = 0.8.
"""
import torch
from torch import Tensor

from harness.estimators.base import Estimator, OldPolicy, PolicyForward, register


def router_shift_gamma(router_logp_new: Tensor, router_logp_old: Tensor, old_topk: Tensor) -> Tensor:
    """gamma per token. router_logp_*: [..., L, E]; old_topk: [..., L, K] expert indices."""
    new = torch.gather(router_logp_new, -1, old_topk)
    old = torch.gather(router_logp_old, -1, old_topk)
    return torch.exp(-(new - old).abs().mean(-1).mean(-1))


def rais_ratio(ratio: Tensor, gamma: Tensor, gamma_min: float) -> Tensor:
    """r * max(gamma, gamma_min), gamma detached."""
    return ratio * gamma.detach().clamp(min=gamma_min)


@register
class RAIS(Estimator):
    name = "rais"

    def old_policy(self, ctx) -> OldPolicy:
        fwd = ctx.recompute()
        if fwd.router_logp is None:
            raise ValueError("rais needs router probabilities; this model has no router (dense)")
        return self.plain(ctx, fwd.logp, router_logp=fwd.router_logp, selected=fwd.selected)

    def ratio(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward) -> Tensor:
        gamma = router_shift_gamma(new.router_logp, old.router_logp, old.selected)
        return rais_ratio(torch.exp(logp_new - old.logp), gamma, self.cfg.gamma_min)
