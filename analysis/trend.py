"""Trend tests for an ordered axis (mean_n's n, TIS's C, a dose, a KL target): one test of "the outcome moves with
x" instead of every pair of levels, with far more power than the pairwise family.

- **Cochran-Armitage** (collapse rate; Armitage 1955, Agresti, *Categorical Data Analysis*, 3rd ed., sec. 5.3.5):
  level i has R_i runs, a_i collapsed, score t_i = its rank (1..K: for n = 1, 2, 4, 8, 16 that is log2 n);
  ``T = sum_i t_i (a_i - R_i pbar)``, ``Var T = pbar (1 - pbar) [sum_i t_i^2 R_i - (sum_i t_i R_i)^2 / N]``,
  ``Z = T / sqrt(Var T)`` (so ``Z^2 = N r^2``, r the Pearson correlation of score and outcome over the N runs),
  two-sided normal p-value. (statsmodels' ``test_ordinal_association`` shifts empty cells by 0.5, which changes
  the statistic of a 0/10 arm, hence the six lines here.) Undefined (p = 1) when no run or every run collapsed.
- **Page's L** (final reward, paired): when every level holds the same seeds (complete blocks, one block per
  seed), ranks within each seed across the K levels, ``L = sum_j j R_j`` (``scipy.stats.page_trend_test``, exact
  for small designs); two-sided as twice the smaller of the two one-sided p-values.
- **Jonckheere-Terpstra** (final reward, unpaired): ``JT = sum_{i<j} sum_{a in g_i, b in g_j} [1(b > a) + 1/2 1(b = a)]``
  with a permutation p-value (levels shuffled over the runs, ``reps`` permutations from a generator keyed by the
  data, two-sided on |JT - E JT|; Hollander, Wolfe & Chicken, *Nonparametric Statistical Methods*, 3rd ed.,
  sec. 6.2). No well-kept Python library ships it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps

from .stats import data_rng


@dataclass(frozen=True)
class TrendResult:
    test: str
    statistic: float
    p: float
    direction: str  # "up", "down" or "" (the sign of the association with x)


def cochran_armitage(levels: Sequence[float], collapsed: Sequence[Sequence[bool]]) -> TrendResult:
    """Trend in the collapse rate across ordered ``levels`` (each with its runs' collapse flags)."""
    order = np.argsort(np.asarray(levels, dtype=float), kind="stable")
    a = np.array([float(np.sum(collapsed[i])) for i in order])
    r = np.array([float(len(collapsed[i])) for i in order])
    t = np.arange(1, len(a) + 1, dtype=float)
    n, pbar = r.sum(), a.sum() / max(r.sum(), 1)
    var = pbar * (1 - pbar) * ((t ** 2 * r).sum() - (t * r).sum() ** 2 / n) if n else 0.0
    if len(a) < 2 or var <= 0:
        return TrendResult("Cochran-Armitage", math.nan, 1.0, "")
    z = float((t * (a - r * pbar)).sum() / math.sqrt(var))
    return TrendResult("Cochran-Armitage", z * z, float(2 * sps.norm.sf(abs(z))), "up" if z > 0 else "down" if z < 0 else "")


def page(blocks: np.ndarray) -> TrendResult:
    """Page's test on ``blocks`` [seeds, K levels in increasing x], two-sided."""
    up = sps.page_trend_test(blocks)
    down = sps.page_trend_test(blocks[:, ::-1])
    p = min(1.0, 2 * min(up.pvalue, down.pvalue))
    return TrendResult("Page", float(up.statistic), float(p), "up" if up.pvalue < down.pvalue else "down")


def jonckheere(groups: Sequence[np.ndarray], reps: int = 10_000, seed: int = 0) -> TrendResult:
    """Jonckheere-Terpstra across ``groups`` in increasing x, permutation p-value (two-sided)."""
    groups = [np.asarray(g, dtype=float)[np.isfinite(g)] for g in groups]
    groups = [g for g in groups if len(g)]
    if len(groups) < 2:
        return TrendResult("Jonckheere-Terpstra", math.nan, 1.0, "")
    values = np.concatenate(groups)
    level = np.repeat(np.arange(len(groups)), [len(g) for g in groups])

    def jt(lv: np.ndarray) -> np.ndarray:  # lv: [R, N] level of each value per permutation
        later = lv[:, None, :] > lv[:, :, None]  # pairs (a, b) with b at a later level
        gt = values[None, :] > values[:, None]
        eq = values[None, :] == values[:, None]
        return (later * (gt + 0.5 * eq)[None]).sum(axis=(1, 2))

    obs = float(jt(level[None])[0])
    sizes = np.array([len(g) for g in groups])
    mean = (len(values) ** 2 - (sizes ** 2).sum()) / 4
    rng = data_rng(seed, groups)
    perms = np.stack([rng.permutation(level) for _ in range(reps)])
    null = np.concatenate([jt(perms[i:i + 200]) for i in range(0, reps, 200)])
    p = (1 + np.sum(np.abs(null - mean) >= abs(obs - mean) - 1e-9)) / (reps + 1)
    return TrendResult("Jonckheere-Terpstra", obs, float(p), "up" if obs > mean else "down" if obs < mean else "")
