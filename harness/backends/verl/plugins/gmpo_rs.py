"""``gmpo_rs`` inside verl: the policy loss ``harness_gmpo_rs`` (registered with verl's ``register_policy_loss``).

    l  = log(pi / pi_old) + log max(gamma, gamma_min)      (gamma detached, before clipping)
    S_i = exp((1/|o_i|) sum_t s_i min(s_i l_t, s_i clip(l_t, -eps, eps))),  loss = -mean_i S_i A_i

It is verl's own GMPO loss (``geo_mean``: ``compute_policy_loss_geo_mean``) evaluated with
``old_log_prob - log max(gamma, gamma_min)``, which adds log max(gamma, gamma_min) to every token log-ratio
and nothing else, and with the clip range ``eps`` = the estimator's ``log_clip`` (``HARNESS_GMPO_LOG_CLIP``,
set by translate.py) in place of the actor's ``clip_ratio`` (which stays ``trainer.clip_eps``). gamma comes
as for ``harness_rais`` (plugins/rais.py: ``router_shift_gamma=`` or the ``router_shift`` context, fed by the
FSDP router patch plugins/rais_fsdp.py, active with ``HARNESS_RAIS=1``).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean, register_policy_loss

from harness.backends.verl.plugins.rais import loss_param, router_factor
from harness.estimators.gmpo_rs import LOG_CLIP_ENV, LOSS_NAME


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_gmpo_rs(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                                rollout_is_weights: torch.Tensor | None = None,
                                router_shift_gamma: torch.Tensor | None = None, gamma_min: float | None = None,
                                log_clip: float | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's GMPO loss with every token ratio multiplied by max(gamma, gamma_min), clipped to exp(+-log_clip)."""
    factor, gamma_metrics = router_factor(log_prob, response_mask, router_shift_gamma, gamma_min, LOSS_NAME)
    eps = loss_param(log_clip, LOG_CLIP_ENV, "its clip range", LOSS_NAME)
    clip = SimpleNamespace(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps)  # all geo_mean reads
    loss, metrics = compute_policy_loss_geo_mean(
        old_log_prob=old_log_prob - torch.log(factor), log_prob=log_prob, advantages=advantages,
        response_mask=response_mask, loss_agg_mode=loss_agg_mode, config=clip, rollout_is_weights=rollout_is_weights)
    metrics["actor/ppo_kl"] = verl_F.masked_mean(old_log_prob - log_prob, response_mask).detach().item()
    return loss, {**metrics, **gamma_metrics}
