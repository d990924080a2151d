"""The policy objectives an estimator's ``loss`` hook can use, per seed of a pack ([S, B, R] tensors).

Token-mean PPO (``ppo_losses``, the default of :meth:`Estimator.loss`), with r the ratio, w the estimator's
detached weight, m the response mask and A the sequence advantage:

    loss = -sum_{b,t} m w min(r A, clip(r, 1 - eps, 1 + eps) A) / sum_{b,t} m
    clipfrac = sum m 1[|r - 1| > eps] / sum m

GMPO, Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673; verl's ``geo_mean`` loss,
``compute_policy_loss_geo_mean``), with l = log r, s = sign(A_i) and clipping in log space:

    S_i = exp( (1/|o_i|) sum_{t: m=1} s min(s l_t, s clip(l_t, -eps, eps)) )   (|o_i| = sum_t m_it)
    loss = -(1/B) sum_i S_i A_i                 (a sequence with no policy token contributes 0)
    clipfrac = sum m 1[|l| > eps] / sum m

A position with m = 0 (padding, a multi-turn observation) is never read: whatever stands there, even a
non-finite value, changes nothing. Imports torch only when called (the registry is read without it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


def per_seed(x: Tensor, size: int) -> Tensor:
    """Rows of a pack's minibatch, seed-major [S B, ...] -> [S, B, ...]."""
    return x.reshape(size, -1, *x.shape[1:])


def ppo_losses(ratio: Tensor, adv: Tensor, weight: Tensor, mask: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """Per seed: the token-mean PPO-clipped loss over unmasked tokens, and the clipped share.
    ratio, weight, mask: [S, B, R]; adv [S, B, 1] -> ([S], [S])."""
    import torch

    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    pg = torch.where(mask > 0, torch.minimum(ratio * adv, clipped * adv), 0.0)  # a masked token is never read
    denom = mask.sum((1, 2)).clamp(min=1.0)
    loss = -(weight * pg * mask).sum((1, 2)) / denom
    clipfrac = (((ratio - 1).abs() > clip_eps).float() * mask).sum((1, 2)) / denom
    return loss, clipfrac


def gmpo_losses(log_ratio: Tensor, adv: Tensor, mask: Tensor, log_clip: float) -> tuple[Tensor, Tensor]:
    """Per seed: GMPO's loss (the sequences' geometric-mean ratio times their advantage, averaged over the B
    sequences) and the share of policy tokens whose log-ratio was outside [-log_clip, log_clip].
    log_ratio, mask: [S, B, R]; adv [S, B, 1] -> ([S], [S])."""
    import torch

    sign = torch.sign(adv)
    l = torch.where(mask > 0, log_ratio, 0.0)  # noqa: E741  (a masked token is never read)
    kept = sign * torch.minimum(sign * l, sign * l.clamp(-log_clip, log_clip))
    n_tok = mask.sum(-1)  # [S, B]
    seq_ratio = ((kept * mask).sum(-1) / n_tok.clamp(min=1.0)).exp()
    has = (n_tok > 0).to(seq_ratio.dtype)
    loss = -(seq_ratio * adv[..., 0] * has).mean(-1)
    clipfrac = ((l.abs() > log_clip).float() * mask).sum((1, 2)) / mask.sum((1, 2)).clamp(min=1.0)
    return loss, clipfrac
