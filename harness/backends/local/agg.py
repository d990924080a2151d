"""Loss aggregation per seed (verl's ``agg_loss`` for a seed pack): an estimator's unreduced
:class:`~harness.estimators.losses.LossTerms` over a minibatch's seed-major rows [S B, ...] -> the loss and the
clipped share of each seed, each reduced within its seed's slice only (a seed's loss is bitwise the same alone or
in a pack). The formulas are those of ``harness/estimators/losses.py``."""
from __future__ import annotations

from torch import Tensor

from harness.estimators.losses import SEQ_MEAN, TOKEN_MEAN, LossTerms


def per_seed(x: Tensor, size: int) -> Tensor:
    """Rows of a pack's minibatch, seed-major [S B, ...] -> [S, B, ...]."""
    return x.reshape(size, -1, *x.shape[1:])


def agg_loss(terms: LossTerms, mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The loss and clipped share of each of ``size`` seeds ([S], [S]) from ``terms`` and the response mask
    ``mask`` [S B, R]: ``token-mean`` -sum_{b,t} m objective / sum m, ``seq-mean`` -mean_b objective;
    clipfrac sum m clipped / sum m (a seed without policy tokens: 0)."""
    m = per_seed(mask, size)
    objective = per_seed(terms.objective, size)
    denom = m.sum((1, 2)).clamp(min=1.0)
    if terms.agg == TOKEN_MEAN:
        loss = -(objective * m).sum((1, 2)) / denom
    elif terms.agg == SEQ_MEAN:
        loss = -objective.mean(-1)
    else:
        raise ValueError(f"unknown loss aggregation {terms.agg!r}; known: {TOKEN_MEAN}, {SEQ_MEAN}")
    clipfrac = (per_seed(terms.clipped, size) * m).sum((1, 2)) / denom
    return loss, clipfrac
