"""The policy objectives an estimator's ``loss`` hook can use, as unreduced terms (:class:`LossTerms`).

An estimator's ``loss`` returns the terms of its surrogate objective row by row (per token, or per sequence where
its objective is per sequence), never a sum or mean over a batch: the trainer reduces them within each seed's slice
of a seed pack (``harness.backends.local.agg.agg_loss``, as verl's ``agg_loss``), so no estimator sees how many
seeds share a batch. With r the ratio, w the estimator's detached weight, m the response mask (``OldPolicy.mask``)
and A the sequence advantage:

Token-mean PPO (``ppo_terms``, the default of :meth:`Estimator.loss`), aggregated ``token-mean``:

    objective_bt = w min(r A, clip(r, 1 - eps, 1 + eps) A)          (0 where m = 0)
    loss = -sum_{b,t} m objective / sum_{b,t} m
    clipfrac = sum m 1[|r - 1| > eps] / sum m

GMPO, Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673; verl's ``geo_mean`` loss,
``compute_policy_loss_geo_mean``; ``gmpo_terms``), with l = log r, s = sign(A_i) and clipping in log space,
aggregated ``seq-mean``:

    S_i = exp( (1/|o_i|) sum_{t: m=1} s min(s l_t, s clip(l_t, -eps, eps)) )   (|o_i| = sum_t m_it)
    objective_i = S_i A_i                       (0 for a sequence with no policy token)
    loss = -(1/B) sum_i objective_i
    clipfrac = sum m 1[|l| > eps] / sum m

A position with m = 0 (padding, a multi-turn observation) is never read: whatever stands there, even a
non-finite value, changes nothing. Imports torch only when called (the registry is read without it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

TOKEN_MEAN = "token-mean"  # objective [B, R]: the mean over the batch's policy tokens (m > 0)
SEQ_MEAN = "seq-mean"  # objective [B]: the mean over the batch's sequences


@dataclass
class LossTerms:
    """What an estimator's ``loss`` returns for a minibatch of B rows: its surrogate objective's terms (to be
    maximised; the loss is minus their aggregate) and which tokens' ratios were clipped, both unreduced."""

    objective: Tensor  # [B, R] per token (agg token-mean) or [B] per sequence (agg seq-mean)
    clipped: Tensor  # [B, R] 1.0 where the token's ratio was clipped (read only where m > 0)
    agg: str = TOKEN_MEAN  # how the trainer reduces ``objective``: TOKEN_MEAN or SEQ_MEAN


def ppo_terms(ratio: Tensor, adv: Tensor, weight: Tensor, mask: Tensor, clip_eps: float) -> LossTerms:
    """PPO's clipped objective per token, weighted: ratio, weight, mask [B, R]; adv [B, 1]."""
    import torch

    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    pg = torch.where(mask > 0, torch.minimum(ratio * adv, clipped * adv), 0.0)  # a masked token is never read
    return LossTerms(weight * pg, ((ratio - 1).abs() > clip_eps).float(), TOKEN_MEAN)


def gmpo_terms(log_ratio: Tensor, adv: Tensor, mask: Tensor, log_clip: float) -> LossTerms:
    """GMPO's objective per sequence (the geometric-mean ratio of its policy tokens times its advantage) and the
    tokens whose log-ratio was outside [-log_clip, log_clip]: log_ratio, mask [B, R]; adv [B, 1]."""
    import torch

    sign = torch.sign(adv)
    l = torch.where(mask > 0, log_ratio, 0.0)  # noqa: E741  (a masked token is never read)
    kept = sign * torch.minimum(sign * l, sign * l.clamp(-log_clip, log_clip))
    n_tok = mask.sum(-1)  # [B]
    seq_ratio = ((kept * mask).sum(-1) / n_tok.clamp(min=1.0)).exp()
    has = (n_tok > 0).to(seq_ratio.dtype)
    return LossTerms(seq_ratio * adv[..., 0] * has, (l.abs() > log_clip).float(), SEQ_MEAN)
