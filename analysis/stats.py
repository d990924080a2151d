"""Across-seed statistics (rliable's methods, implemented with numpy, seeded).

- **IQM** (interquartile mean): the 25 % trimmed mean, ``scipy.stats.trim_mean(x, 0.25)``: drop
  ``floor(0.25 N)`` values at each end of the sorted scores and average the rest (the plain mean for
  N < 4).
- **Stratified bootstrap CI** (Agarwal et al. 2021, rliable ``StratifiedBootstrap``): resample the runs
  with replacement *within each stratum* (task), independently per stratum, recompute the statistic
  on the pooled resample; the CI is the percentile interval ``[q_(1-ci)/2, q_(1+ci)/2]`` of the
  ``reps`` replicates. With one stratum it is the ordinary bootstrap. The random stream is keyed by the
  seed *and the data* (:func:`data_rng`: each stratum's values sorted, strata sorted): an interval is a
  function of the numbers alone, so the same runs give the same interval in any report, in any group
  order, beside any other groups (rliable ignores its ``random_state``).
- **Probability of improvement** ``P(X > Y)``: per stratum the Mann-Whitney U statistic
  ``mean_{i,j} [1(x_i > y_j) + 0.5 * 1(x_i = y_j)]``, averaged over strata; CI by resampling X and Y
  independently within strata.
- **Survival** (Kaplan-Meier): ``S(t) = prod_{t_i <= t} (1 - d_i / n_i)`` over the distinct event
  times ``t_i`` (d_i collapses at t_i, n_i runs still at risk), censored runs leave the risk set after
  their last step.
- **Wilson interval** of a proportion k/n at level ci.
- **Newcombe's interval** of a difference of two proportions ``d = p1 - p2`` (Newcombe 1998, method 10,
  the hybrid score interval) from the two Wilson intervals ``[l1, u1]``, ``[l2, u2]``:
  ``[d - sqrt((p1 - l1)^2 + (u2 - p2)^2), d + sqrt((u1 - p1)^2 + (p2 - l2)^2)]``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

TRIM = 0.25


def iqm(x: np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Interquartile mean (25 % trimmed mean); NaN for an empty input."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return math.nan
    if axis is None:
        return float(sps.trim_mean(x.ravel(), TRIM))
    return sps.trim_mean(x, TRIM, axis=axis)


def nan_iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """IQM along ``axis`` ignoring NaN (each slice trimmed by its own count of finite values)."""
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    s = np.sort(x, axis=-1)  # NaN sorts last
    k = np.isfinite(s).sum(axis=-1, keepdims=True)
    g = np.floor(TRIM * k)
    pos = np.arange(s.shape[-1])
    keep = (pos >= g) & (pos < k - g)
    total = np.where(keep, np.nan_to_num(s), 0.0).sum(axis=-1)
    count = keep.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


@dataclass(frozen=True)
class Interval:
    point: float
    lo: float
    hi: float

    def fmt(self, digits: int = 3) -> str:
        if not np.isfinite(self.point):
            return "n/a"
        if not (np.isfinite(self.lo) and np.isfinite(self.hi)):
            return f"{self.point:.{digits}f}"
        return f"{self.point:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def _strata(scores: Sequence[np.ndarray] | np.ndarray) -> list[np.ndarray]:
    if isinstance(scores, np.ndarray) and scores.ndim == 1:
        return [scores.astype(float)]
    return [np.asarray(s, dtype=float).ravel() for s in scores]


def data_rng(seed: int, *arrays: Sequence[np.ndarray]) -> np.random.Generator:
    """A generator keyed by ``seed`` and the values of ``arrays`` (lists of strata), independent of the order
    of the values within a stratum and of the strata: its draws resample the sorted strata (:func:`_canonical`)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for strata in arrays:
        for s in strata:
            h.update(np.ascontiguousarray(s, dtype=np.float64).tobytes())
            h.update(b"|")
        h.update(b"#")
    return np.random.default_rng([int(seed), *np.frombuffer(h.digest(), dtype=np.uint32).tolist()])


def _canonical(strata: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each stratum's values sorted, the strata in sorted order: what the data-keyed bootstrap resamples."""
    return sorted((np.sort(np.asarray(s, dtype=float)) for s in strata), key=lambda a: (len(a), a.tolist()))


def stratified_resample(strata: Sequence[np.ndarray], reps: int, rng: np.random.Generator) -> np.ndarray:
    """``(reps, N)`` bootstrap resamples: each stratum resampled with replacement on its own."""
    parts = []
    for s in strata:
        idx = rng.integers(0, len(s), size=(reps, len(s)))
        parts.append(s[idx])
    return np.concatenate(parts, axis=1)


def bootstrap_ci(
    scores: Sequence[np.ndarray] | np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] = lambda r: iqm(r, axis=1),
    reps: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Point estimate and stratified bootstrap percentile CI of ``statistic``.

    ``scores``: a 1-D array (one stratum) or a list of arrays, one per stratum (task).
    ``statistic`` maps a ``(reps, N)`` array to ``reps`` values (default: IQM along axis 1).
    With fewer than 2 scores in total the CI is (NaN, NaN).
    """
    strata = [s[np.isfinite(s)] for s in _strata(scores)]
    strata = [s for s in strata if len(s)]
    if not strata:
        return Interval(math.nan, math.nan, math.nan)
    strata = _canonical(strata)
    pooled = np.concatenate(strata)
    point = float(statistic(pooled[None, :])[0])
    if len(pooled) < 2:
        return Interval(point, math.nan, math.nan)
    rng = data_rng(seed, strata)
    boots = statistic(stratified_resample(strata, reps, rng))
    lo, hi = np.quantile(boots, [(1 - ci) / 2, (1 + ci) / 2])
    return Interval(point, float(lo), float(hi))


def iqm_ci(scores, reps: int = 10_000, ci: float = 0.95, seed: int = 0) -> Interval:
    """IQM with its stratified bootstrap CI."""
    return bootstrap_ci(scores, lambda r: iqm(r, axis=1), reps, ci, seed)


def prob_improvement_point(x: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney ``P(X > Y) + 0.5 P(X = Y)`` for two samples."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    gt = (x[:, None] > y[None, :]).mean()
    eq = (x[:, None] == y[None, :]).mean()
    return float(gt + 0.5 * eq)


def _poi_batch(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
    """Row-wise P(X > Y) for resamples ``xb (reps, nx)``, ``yb (reps, ny)`` (chunked: bounded memory)."""
    out = np.empty(len(xb))
    step = max(1, int(4_000_000 // max(1, xb.shape[1] * yb.shape[1])))
    for i in range(0, len(xb), step):
        a, b = xb[i:i + step, :, None], yb[i:i + step, None, :]
        out[i:i + step] = (a > b).mean(axis=(1, 2)) + 0.5 * (a == b).mean(axis=(1, 2))
    return out


def probability_of_improvement(
    x: Sequence[np.ndarray] | np.ndarray,
    y: Sequence[np.ndarray] | np.ndarray,
    reps: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
) -> Interval:
    """P(X > Y) averaged over strata (paired by position), with a stratified bootstrap CI.

    ``x``/``y``: 1-D arrays (one stratum) or lists of per-stratum arrays of equal length.
    """
    xs = [s[np.isfinite(s)] for s in _strata(x)]
    ys = [s[np.isfinite(s)] for s in _strata(y)]
    if len(xs) != len(ys):
        raise ValueError("probability_of_improvement: x and y need the same strata")
    pairs = [(np.sort(a), np.sort(b)) for a, b in zip(xs, ys) if len(a) and len(b)]
    if not pairs:
        return Interval(math.nan, math.nan, math.nan)
    point = float(np.mean([prob_improvement_point(a, b) for a, b in pairs]))
    if all(len(a) < 2 and len(b) < 2 for a, b in pairs):
        return Interval(point, math.nan, math.nan)
    rng = data_rng(seed, [a for a, _ in pairs], [b for _, b in pairs])
    boots = np.zeros(reps)
    for a, b in pairs:
        xb = a[rng.integers(0, len(a), size=(reps, len(a)))]
        yb = b[rng.integers(0, len(b), size=(reps, len(b)))]
        boots += _poi_batch(xb, yb)
    boots /= len(pairs)
    lo, hi = np.quantile(boots, [(1 - ci) / 2, (1 + ci) / 2])
    return Interval(point, float(lo), float(hi))


def curve_band(values: np.ndarray, reps: int = 500, ci: float = 0.95, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step IQM and bootstrap CI across runs.

    ``values``: ``(runs, steps)`` with NaN where a run has no value. Returns ``(iqm, lo, hi)``, each
    of length ``steps``; the band is NaN where fewer than 2 runs have a value.
    """
    v = np.asarray(values, dtype=float)
    center = nan_iqm(v, axis=0)
    n_runs = v.shape[0]
    avail = np.isfinite(v).sum(axis=0)
    if n_runs < 2:
        nan = np.full(v.shape[1], np.nan)
        return center, nan, nan
    v = v[np.lexsort(np.nan_to_num(v, nan=np.inf).T[::-1])]  # runs in a canonical order: the band keys on the data
    rng = data_rng(seed, [v.ravel()])
    lo = np.full(v.shape[1], np.nan)
    hi = np.full(v.shape[1], np.nan)
    chunk = max(1, int(2_000_000 // max(1, reps * n_runs)))  # bound memory: reps x runs x chunk
    for start in range(0, v.shape[1], chunk):
        block = v[:, start:start + chunk]
        idx = rng.integers(0, n_runs, size=(reps, n_runs))
        boots = nan_iqm(block[idx], axis=1)  # (reps, chunk)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN steps give NaN bands
            q = np.nanquantile(boots, [(1 - ci) / 2, (1 + ci) / 2], axis=0)
        lo[start:start + chunk], hi[start:start + chunk] = q
    few = avail < 2
    lo[few], hi[few] = np.nan, np.nan
    return center, lo, hi


def kaplan_meier(durations: np.ndarray, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier survival: step times ``t`` (starting at 0 / the first time) and ``S(t)``.

    ``durations``: event or censoring time per run; ``events``: True where the event happened.
    ``S`` is right-continuous: ``S[k]`` holds from ``t[k]`` until ``t[k+1]``.
    """
    d = np.asarray(durations, dtype=float)
    e = np.asarray(events, dtype=bool)
    ok = np.isfinite(d)
    d, e = d[ok], e[ok]
    if len(d) == 0:
        return np.array([0.0]), np.array([1.0])
    times = np.unique(d[e])
    surv, s = [1.0], 1.0
    start = min(0.0, float(d.min()))
    t_out = [start]
    for t in times:
        at_risk = int((d >= t).sum())
        died = int(((d == t) & e).sum())
        if at_risk:
            s *= 1.0 - died / at_risk
        t_out.append(float(t))
        surv.append(s)
    return np.array(t_out), np.array(surv)


def survival_at(t_grid: np.ndarray, durations: np.ndarray, events: np.ndarray) -> np.ndarray:
    """Kaplan-Meier S evaluated on ``t_grid``."""
    t, s = kaplan_meier(durations, events)
    idx = np.searchsorted(t, np.asarray(t_grid, dtype=float), side="right") - 1
    return np.where(idx >= 0, s[np.clip(idx, 0, None)], 1.0)


def km_median(durations: np.ndarray, events: np.ndarray) -> float:
    """The first time the Kaplan-Meier curve reaches <= 0.5; NaN when it never does."""
    t, s = kaplan_meier(durations, events)
    hit = np.nonzero(s <= 0.5)[0]
    return float(t[hit[0]]) if len(hit) else math.nan


def wilson(k: int, n: int, ci: float = 0.95) -> Interval:
    """Proportion k/n with its Wilson score interval."""
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    z = float(sps.norm.ppf(0.5 + ci / 2))
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, mid - half)
    hi = 1.0 if k == n else min(1.0, mid + half)
    return Interval(p, lo, hi)


def newcombe_diff(k1: int, n1: int, k2: int, n2: int, ci: float = 0.95) -> Interval:
    """Difference ``k1/n1 - k2/n2`` with Newcombe's hybrid score interval (module docstring); NaN when a
    sample is empty."""
    a, b = wilson(k1, n1, ci), wilson(k2, n2, ci)
    if not (n1 and n2):
        return Interval(math.nan, math.nan, math.nan)
    d = a.point - b.point
    lo = d - math.sqrt((a.point - a.lo) ** 2 + (b.hi - b.point) ** 2)
    hi = d + math.sqrt((a.hi - a.point) ** 2 + (b.point - b.lo) ** 2)
    return Interval(d, max(-1.0, lo), min(1.0, hi))
