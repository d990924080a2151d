"""Power and planning: how many seeds a comparison needs, computed for the very tests the report uses.

- **Collapse, unpaired** (Fisher's exact test, two-sided): exact power by enumerating both binomial outcomes,
  ``power = sum_{k1, k2} Bin(k1; n, p1) Bin(k2; n, p2) 1[p_Fisher(k1, k2) <= a]``.
- **Collapse, paired** (McNemar's exact test): each seed gives a pair of outcomes; the discordant pairs
  (A collapsed and B not: probability ``p10``; B and not A: ``p01``) decide. Without a model of how seeds
  correlate the two arms' outcomes, seeds are taken as independent draws (``p10 = p1 (1 - p2)``,
  ``p01 = p2 (1 - p1)``), which is conservative when a seed effect makes outcomes agree. Exact power by
  enumerating the discordant counts: ``sum_{b, c} Multinomial(b, c; n, p10, p01) 1[p_binom(min(b,c); b+c) <= a]``.
- **Final reward, paired** (Wilcoxon signed-rank): by simulation of normal paired differences with mean
  ``delta`` (in units of the sd of the paired differences), ``reps`` draws from a fixed seed, each tested with
  ``scipy.stats.wilcoxon``.
- **Multiplicity**: a report's family of m tests is Holm-corrected; the first rejection needs ``p <= alpha / m``,
  so the power of one true difference among m is computed at level ``a = alpha / m`` (exact for the smallest
  p-value; Holm's later steps are less strict, so this is the conservative figure).

``seeds_needed`` scans n upward and returns the first n whose power reaches the target (power is not monotone
in n for exact tests; the scan reports the first crossing, and the table around it says how it moves).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps


@lru_cache(maxsize=None)
def _fisher_p_table(n1: int, n2: int) -> np.ndarray:
    """Two-sided Fisher p-value of every (k1, k2) outcome, [n1 + 1, n2 + 1]."""
    out = np.empty((n1 + 1, n2 + 1))
    for k1 in range(n1 + 1):
        for k2 in range(n2 + 1):
            out[k1, k2] = sps.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]])[1]
    return out


def power_fisher(n1: int, n2: int, p1: float, p2: float, alpha: float = 0.05) -> float:
    """Exact power of Fisher's two-sided test of collapse rates p1 vs p2 with n1, n2 seeds."""
    w1 = sps.binom.pmf(np.arange(n1 + 1), n1, p1)
    w2 = sps.binom.pmf(np.arange(n2 + 1), n2, p2)
    reject = _fisher_p_table(n1, n2) <= alpha + 1e-12
    return float(w1 @ reject.astype(float) @ w2)


def mcnemar_p(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """McNemar's exact two-sided p-value from the discordant counts b, c: ``min(1, 2 Bin(min(b,c); b+c, 1/2))``."""
    b, c = np.asarray(b), np.asarray(c)
    n = b + c
    p = np.minimum(1.0, 2 * sps.binom.cdf(np.minimum(b, c), np.maximum(n, 1), 0.5))
    return np.where(n == 0, 1.0, p)


def power_mcnemar(n: int, p1: float, p2: float, alpha: float = 0.05) -> float:
    """Exact power of McNemar's exact test with n paired seeds, independent outcomes per seed (module doc)."""
    p10, p01 = p1 * (1 - p2), p2 * (1 - p1)
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    ok = b + c <= n
    b, c = b[ok], c[ok]
    prob = np.exp(sps.multinomial.logpmf(np.stack([b, c, n - b - c], 1), n, [p10, p01, max(0.0, 1 - p10 - p01)]))
    return float(prob[mcnemar_p(b, c) <= alpha + 1e-12].sum())


def power_wilcoxon(n: int, delta: float, alpha: float = 0.05, reps: int = 2000, seed: int = 0) -> float:
    """Power of the two-sided Wilcoxon signed-rank test, n pairs, standardized mean difference ``delta``."""
    rng = np.random.default_rng(seed)
    d = rng.normal(delta, 1.0, size=(reps, n))
    p = sps.wilcoxon(d, axis=1).pvalue
    return float(np.mean(p <= alpha))


def power(n: int, p1: float | None = None, p2: float | None = None, delta: float | None = None,
          paired: bool = True, alpha: float = 0.05, family: int = 1) -> float:
    """Power at n seeds per arm of the report's test (collapse: p1 vs p2; reward: delta), at level alpha/family."""
    a = alpha / max(1, family)
    if delta is not None:
        return power_wilcoxon(n, delta, a)
    if p1 is None or p2 is None:
        raise ValueError("give p1 and p2 (collapse rates) or delta (a standardized reward difference)")
    return power_mcnemar(n, p1, p2, a) if paired else power_fisher(n, n, p1, p2, a)


def seeds_needed(target: float = 0.8, n_max: int = 200, **kw) -> tuple[int | None, list[tuple[int, float]]]:
    """(the first n in 2..n_max reaching ``target`` power or None, [(n, power)] scanned)."""
    scanned = []
    for n in range(2, n_max + 1):
        pw = power(n, **kw)
        scanned.append((n, pw))
        if pw >= target:
            return n, scanned
    return None, scanned


def smallest_rate_detectable(n: int, base: float, paired: bool = True, alpha: float = 0.05, family: int = 1,
                             target: float = 0.8) -> float:
    """The smallest collapse rate p1 > base that the report's test detects with ``target`` power at n seeds per
    arm and a family of ``family`` tests (NaN when even p1 = 1 is not detected)."""
    grid = np.round(np.arange(base + 0.01, 1.0001, 0.01), 2)
    for p1 in grid:
        if power(n, p1=float(p1), p2=base, paired=paired, alpha=alpha, family=family) >= target:
            return float(p1)
    return math.nan


def smallest_shift_detectable(n: int, alpha: float = 0.05, family: int = 1, target: float = 0.8) -> float:
    """The smallest standardized paired reward difference (mean / sd of the differences) the Wilcoxon test
    detects with ``target`` power at n pairs: by the noncentral t power of the paired t test at the Wilcoxon's
    asymptotic relative efficiency under normality (3/pi), i.e. at 3n/pi effective pairs (Lehmann, *Nonparametrics*,
    1975, ch. 4); NaN below 2 pairs."""
    if n < 2:
        return math.nan
    a = alpha / max(1, family)
    eff = max(2.0, 3 * n / math.pi)
    df = eff - 1
    crit = sps.t.ppf(1 - a / 2, df)
    for delta in np.arange(0.01, 10.0, 0.01):
        nc = delta * math.sqrt(eff)
        if sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc) >= target:
            return float(round(delta, 2))
    return math.nan


def cli(args) -> int:
    """``python -m analysis power``: seeds needed (or the power at ``--seeds``), with the scan around the answer."""
    from .config import ConfigError

    rates = args.p1 is not None and args.p2 is not None
    if rates == (args.delta is not None):
        raise ConfigError("power: give --p1 and --p2 (collapse rates) or --delta (a paired reward shift in sd)")
    if rates and not (0 <= args.p1 <= 1 and 0 <= args.p2 <= 1 and args.p1 != args.p2):
        raise ConfigError(f"power: --p1 and --p2 must be two different rates in [0, 1], got {args.p1}, {args.p2}")
    if args.family < 1 or not 0 < args.alpha < 1 or not 0 < args.target < 1:
        raise ConfigError("power: --family >= 1, --alpha and --power in (0, 1)")
    kw = dict(paired=not args.unpaired, alpha=args.alpha, family=args.family)
    kw.update(p1=args.p1, p2=args.p2) if rates else kw.update(delta=args.delta)
    what = (f"collapse {args.p1:g} vs {args.p2:g}, {'Fisher exact (unpaired)' if args.unpaired else 'McNemar exact (paired)'}"
            if rates else f"paired reward shift {args.delta:g} sd, Wilcoxon signed-rank (simulated, 2000 draws)")
    level = f"alpha {args.alpha:g}" + (f" / {args.family} tests (Holm's first step)" if args.family > 1 else "")
    if args.seeds is not None:
        print(f"{what}, {level}: power {power(args.seeds, **kw):.3f} at {args.seeds} seeds per arm")
        return 0
    n, scanned = seeds_needed(args.target, **kw)
    for k, pw in scanned[-6:]:
        print(f"  {k:4d} seeds  power {pw:.3f}")
    if n is None:
        print(f"{what}, {level}: {args.target:.0%} power is not reached by 200 seeds per arm")
    else:
        print(f"{what}, {level}: {n} seeds per arm for {args.target:.0%} power")
    return 0
