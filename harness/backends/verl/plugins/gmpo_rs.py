"""``gmpo_rs`` inside verl: the policy loss ``harness_gmpo_rs`` (registered with verl's ``register_policy_loss``).

    l  = log(pi / pi_old) + log max(gamma, gamma_min)      (gamma detached, before clipping)
    S_i = exp((1/|o_i|) sum_t s_i min(s_i l_t, s_i clip(l_t, -eps, eps))),  loss = -mean_i S_i A_i

It is verl's own GMPO loss (``geo_mean``: ``compute_policy_loss_geo_mean``) evaluated with
``old_log_prob - log max(gamma, gamma_min)``, which adds log max(gamma, gamma_min) to every token log-ratio
and nothing else, and with the clip range ``eps`` = the estimator's ``log_clip`` (``HARNESS_GMPO_LOG_CLIP``,
set by translate.py) in place of the actor's ``clip_ratio`` (which stays ``trainer.clip_eps``). gamma comes
as for ``harness_rais`` (plugins/rais.py: ``router_shift_gamma=`` or the ``router_shift`` context, fed by the
FSDP router patch plugins/rais_fsdp.py, active with ``HARNESS_RAIS=1``).

**Normalised over the global batch** (issue 30). verl's ``geo_mean`` ends with ``torch.mean(pg_losses)``: a mean
over the *micro-batch*, while verl's engines call the loss once per micro-batch, backpropagate each and sum the
gradients (``FSDPEngine.forward_backward_batch``), expecting each micro-batch loss to be normalised over the global
mini-batch as ``agg_loss`` does with ``config.global_batch_info`` (``ppo_loss`` fills it: ``dp_size``,
``global_batch_size`` = ppo_mini_batch_size x rollout.n sequences over all ranks). Left as it is, the summed loss
and the gradient grow with the number of micro-batches (x2, x4; with dynamic batch sizes another factor every
step). ``global_scale`` turns the micro-batch mean into agg_loss's sequence mean over the global batch:

    loss = mean_{i in micro} L_i * B_micro * dp_size / global_batch_size = sum_{i in micro} L_i / G * dp_size

so the micro-batch losses sum, and the data-parallel average of the gradients lands, on the mean over the
mini-batch's G sequences (``tests/backends/verl/test_verl_micro_batches.py``: 1, 2, 4 and dynamic micro-batches
through verl's own ``forward_backward_batch`` give the same summed loss and gradient). Without
``global_batch_size`` (a direct call) the micro-batch mean is kept, and ``dp_size > 1`` without it is an error,
as in ``agg_loss``.
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
    loss = loss * global_scale(response_mask, config)
    metrics["actor/ppo_kl"] = verl_F.masked_mean(old_log_prob - log_prob, response_mask).detach().item()
    return loss, {**metrics, **gamma_metrics}


def global_scale(response_mask: torch.Tensor, config: Any) -> float:
    """B_micro * dp_size / global_batch_size: turns geo_mean's micro-batch mean into verl's global sequence mean
    (``agg_loss``'s seq-mean with ``config.global_batch_info``); 1 where the engine gave no global batch size."""
    info = getattr(config, "global_batch_info", None) or {}
    dp_size = int(info.get("dp_size") or 1)
    global_batch_size = info.get("global_batch_size")
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"policy loss {LOSS_NAME}: global_batch_size is required when dp_size > 1 "
                             "(verl's ppo_loss sets config.global_batch_info)")
        return 1.0
    return response_mask.shape[0] * dp_size / float(global_batch_size)
