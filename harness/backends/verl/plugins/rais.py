"""``rais`` inside verl: the policy loss ``harness_rais`` (registered with verl's ``register_policy_loss``).

    gamma = exp(-(1/L) sum_l (1/K) sum_{e in old top-K} |log p_l(e) - log p_l_old(e)|)   (per token)
    r'    = r * max(gamma, gamma_min)      (gamma detached, before clipping; harness.estimators.rais)

The loss is verl's own ``vanilla`` PPO loss (its clipping, optional dual clip, rollout-correction
weights and global token-mean aggregation) evaluated with ``old_log_prob - log max(gamma,
gamma_min)``, which multiplies the ratio by the router-shift factor and nothing else.

What verl must provide (verl 0.9.1 does not): gamma needs, per response token, the router
log-probs of every MoE layer at the *old* top-K experts, from the pre-update forward
(``compute_log_prob``) and from the current forward of the update. verl's policy losses receive
only (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights), so the engine has to (1) return ``router_topk_logp`` [tokens, L, K] and
``router_topk_idx`` from ``compute_log_prob`` (as the Megatron engine already returns
``routed_experts`` for router replay R2), (2) gather the current router log-probs at those indices
in the update forward, and (3) hand gamma to this loss: ``router_shift_gamma=`` or, from inside
the worker's forward, ``with router_shift(gamma): ...``. ``gamma_from_router`` computes gamma from
the two gathered tensors. Without gamma the loss raises instead of silently training vanilla PPO.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator, Optional

import torch

from harness.estimators.rais import GAMMA_MIN_ENV, LOSS_NAME, rais_ratio, router_shift_gamma
_GAMMA: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar("harness_rais_gamma", default=None)


@contextlib.contextmanager
def router_shift(gamma: torch.Tensor) -> Iterator[None]:
    """Make ``gamma`` [B, R] (per response token) visible to the loss within the block."""
    token = _GAMMA.set(gamma)
    try:
        yield
    finally:
        _GAMMA.reset(token)


def gamma_from_router(router_logp_new_at_old_topk: torch.Tensor, router_logp_old_at_old_topk: torch.Tensor) -> torch.Tensor:
    """gamma from router log-probs already gathered at the old top-K: [..., L, K] -> [...]."""
    k = router_logp_old_at_old_topk.shape[-1]
    idx = torch.arange(k, device=router_logp_old_at_old_topk.device).expand_as(router_logp_old_at_old_topk)
    return router_shift_gamma(router_logp_new_at_old_topk, router_logp_old_at_old_topk, idx)


def scale(gamma: torch.Tensor, gamma_min: float) -> torch.Tensor:
    """max(gamma, gamma_min), detached: the factor ``rais_ratio`` multiplies the ratio by."""
    return rais_ratio(torch.ones_like(gamma), gamma, gamma_min)


def loss_param(explicit: Optional[float], env: str, what: str, loss: str) -> float:
    """A policy loss's parameter: the keyword verl passed, else the environment variable translate.py sets."""
    if explicit is not None:
        return float(explicit)
    raw = os.environ.get(env)
    if raw is None:
        raise RuntimeError(f"policy loss {loss} needs {what}: set {env} (translate.py does)")
    return float(raw)


import verl.utils.torch_functional as verl_F  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss  # noqa: E402


def router_factor(log_prob: torch.Tensor, response_mask: torch.Tensor, explicit_gamma: Optional[torch.Tensor],
                  gamma_min: Optional[float], loss: str) -> tuple[torch.Tensor, dict[str, Any]]:
    """max(gamma, gamma_min) per response token (detached), from ``router_shift_gamma=`` or the ``router_shift``
    context, and the gamma metrics; raises where verl handed no gamma (never silently trains without it)."""
    gamma = explicit_gamma if explicit_gamma is not None else _GAMMA.get()
    if gamma is None:
        raise RuntimeError(
            f"policy loss {loss} got no router-shift factor: verl must pass per-token gamma from the MoE "
            "router log-probs (see harness/backends/verl/plugins/rais.py); verl 0.9.1 does not")
    if gamma.shape != log_prob.shape:
        raise ValueError(f"gamma {tuple(gamma.shape)} must match the response log-probs {tuple(log_prob.shape)}")
    g_min = loss_param(gamma_min, GAMMA_MIN_ENV, "gamma_min", loss)
    metrics = {"actor/rais_gamma_mean": verl_F.masked_mean(gamma.detach(), response_mask).item(),
               "actor/rais_gamma_floor_frac": verl_F.masked_mean((gamma < g_min).float(), response_mask).item()}
    return scale(gamma.to(log_prob.dtype), g_min), metrics


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_rais(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    router_shift_gamma: torch.Tensor | None = None,
    gamma_min: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's vanilla PPO loss with the ratio multiplied by max(gamma, gamma_min)."""
    factor, gamma_metrics = router_factor(log_prob, response_mask, router_shift_gamma, gamma_min, LOSS_NAME)
    shifted_old = old_log_prob - torch.log(factor)  # exp(logp - shifted_old) = r * max(gamma, gamma_min)
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=shifted_old, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
        loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)
    metrics["actor/ppo_kl"] = verl_F.masked_mean(old_log_prob - log_prob, response_mask).detach().item()
    return loss, {**metrics, **gamma_metrics}
