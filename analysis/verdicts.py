"""Verdicts: which groups differ, by paired tests where seeds pair, corrected for multiplicity within a family.

**Pairing.** In this harness seed s gives every arm the same warm start and the same prompts (both are functions
of (model, task, seed)), so two groups of one experiment with the same model and task *pair* on the seeds they
share. Paired comparisons use the common seeds only:

- collapse: **McNemar's exact test**, two-sided: of the discordant seeds (b: A collapsed and B not, c: the
  reverse), ``p = min(1, 2 P(Bin(b + c, 1/2) <= min(b, c)))`` (McNemar 1947; the exact conditional form);
- final reward (and AUC): **Wilcoxon's signed-rank test**, two-sided, on the per-seed differences A - B
  (``scipy.stats.wilcoxon``, zero differences dropped; p = 1 when every difference is 0).

Groups that do not pair (another model or task) use **Fisher's exact test** (collapse) and the **Mann-Whitney U
test** (final reward, AUC). Every row says which test it used.

**Families and multiplicity.** The tests of a report form families: the **primary** contrasts (pairs and ordered
trends declared before the runs, ``primary``), and the **exploratory** rest (every other pair, both endpoints,
and the trend of each ordered sweep family). Within each family the p-values are **Holm**-adjusted (family-wise
error <= alpha) with **Benjamini-Hochberg** q-values beside them (``scipy.stats.false_discovery_control``). Holm's
adjusted p is ``p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j))`` over the sorted p-values (Holm 1979), written out
in :func:`holm` because ``statsmodels``' ``multipletests(method="holm")`` runs ``gc.collect()`` on every call
(0.1-0.2 s each in a large process, which the null simulations of the tests call thousands of times); the tests
check it against statsmodels.
A comparison **separates** when its Holm-adjusted p < alpha; otherwise its difference is **not shown**. A pair
with fewer than ``min_seeds`` seeds in a group (paired: common seeds) is **too few seeds**: it is reported, never
tested into a family, never "separates".

**Effects and intervals**, at the simultaneous level ``1 - alpha / m`` (Bonferroni over the family's m tests), the
intervals the forest plot draws. Paired ones invert the very test that gives the p-value, so an interval excludes 0
exactly when the test rejects at that level:

- paired collapse: the rate difference ``(b - c) / n``; interval ``(b + c) / n (2 pi - 1)`` over the exact
  Clopper-Pearson interval of ``pi = b / (b + c)`` (the McNemar test conditions on the b + c discordant seeds);
  with no discordant seed (b = c = 0: no event in either arm, or the same seeds collapse) the difference is bounded
  by the share of discordant seeds, whose exact upper bound at 0 of n is ``u = 1 - (a/2)^(1/n)``: ``[-u, u]``
  (about +-0.11 at 95% and 32 seeds), never a zero-width interval that reads as a precise null;
- paired rewards: the Hodges-Lehmann estimate (median of the Walsh averages ``(d_i + d_j) / 2``, i <= j) with the
  exact Wilcoxon interval ``[W_(k), W_(N - k + 1)]`` of the sorted Walsh averages, k from the exact null
  distribution of the signed-rank statistic (Hollander, Wolfe & Chicken 2014, sec. 3.3); unbounded when the level
  is out of reach (10 seeds cannot give more than 1 - 2/2^10 = 99.8%);
- unpaired collapse: Newcombe's hybrid score interval; unpaired rewards: the difference of means with an
  independent bootstrap percentile interval (not a test inversion: it can exclude 0 where Mann-Whitney does not
  reject).

**Horizon.** A collapse test is repeated with the runs' collapse verdicts on the curve cut by 5% and 10% of its
steps (``collapsed_h95``, ``collapsed_h90`` of :mod:`analysis.measures`); the row says whether the verdict holds
there at the same Holm threshold (this test's step of Holm's procedure, ``alpha / (m - i)``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from .power import mcnemar_p
from .stats import data_rng, newcombe_diff

ENDPOINTS = {"collapse": "collapsed", "final": "final", "auc": "auc"}
SEPARATES, NOT_SHOWN, TOO_FEW = "separates", "not shown", "too few seeds"


@dataclass
class Comparison:
    """One test: a pair (a, b) on one endpoint, or a trend along x."""
    kind: str  # "pair" | "trend"
    a: str  # group label (a trend: the family's name)
    b: str  # group label (a trend: the ordered levels, "n=1<2<4")
    endpoint: str  # collapse | final | auc
    test: str
    paired: bool
    n_a: int
    n_b: int
    n_pairs: int  # common seeds (paired), 0 otherwise
    effect: float  # rate A - B, or mean difference A - B; a trend: its direction (+1 up, -1 down)
    p: float
    family: str = "exploratory"  # primary | exploratory | none (too few seeds)
    p_holm: float = math.nan
    q_bh: float = math.nan
    threshold: float = math.nan  # Holm's step threshold for this test
    lo: float = math.nan
    hi: float = math.nan
    verdict: str = NOT_SHOWN
    holds_h95: str = ""  # collapse tests: "yes" / "no" / "" (not applicable)
    holds_h90: str = ""
    p_h95: float = math.nan
    p_h90: float = math.nan
    _data: tuple = field(default=(), repr=False)  # what the interval resamples

    def row(self) -> dict:
        d = asdict(self)
        d.pop("_data")
        return d


def pairs_on_seeds(runs: pd.DataFrame | None, a: str, b: str) -> bool:
    """Whether groups a and b pair (same model and task: same warm start and prompts per seed)."""
    if runs is None or not {"model", "task"} <= set(runs.columns):
        return True
    keys = ["model", "task"]
    ka = runs.loc[runs["label"] == a, keys].drop_duplicates()
    kb = runs.loc[runs["label"] == b, keys].drop_duplicates()
    return len(ka) == 1 and len(kb) == 1 and ka.iloc[0].tolist() == kb.iloc[0].tolist()


def _wilcoxon_p(d: np.ndarray) -> float:
    d = d[np.isfinite(d)]
    if len(d) == 0 or np.all(d == 0):
        return 1.0
    return float(sps.wilcoxon(d).pvalue)


def compare_pair(ga: pd.DataFrame, gb: pd.DataFrame, a: str, b: str, endpoint: str, paired: bool,
                 min_seeds: int) -> Comparison:
    """One test of groups a, b (their measures rows) on ``endpoint``."""
    col = ENDPOINTS[endpoint]
    if paired:
        xa = (ga if ga.index.name == "seed" else ga.drop_duplicates("seed").set_index("seed"))[col]
        xb = (gb if gb.index.name == "seed" else gb.drop_duplicates("seed").set_index("seed"))[col]
        common = xa.index.intersection(xb.index)
        x, y = xa.loc[common].to_numpy(float), xb.loc[common].to_numpy(float)
        if endpoint == "collapse":
            bb, cc = int(np.sum((x == 1) & (y == 0))), int(np.sum((x == 0) & (y == 1)))
            p = float(mcnemar_p(np.array(bb), np.array(cc)))
            test, effect = "McNemar exact", (bb - cc) / len(common) if len(common) else math.nan
        else:
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            p, test, effect = _wilcoxon_p(x - y), "Wilcoxon signed-rank", hodges_lehmann(x - y)
        n_pairs = len(x)
        enough = n_pairs >= min_seeds
        data = (x, y)
    else:
        x, y = ga[col].to_numpy(float), gb[col].to_numpy(float)
        x, y = x[np.isfinite(x)], y[np.isfinite(y)]
        if endpoint == "collapse":
            k1, k2 = int(x.sum()), int(y.sum())
            p = float(sps.fisher_exact([[k1, len(x) - k1], [k2, len(y) - k2]])[1]) if len(x) and len(y) else 1.0
            test = "Fisher exact"
        else:
            p = float(sps.mannwhitneyu(x, y).pvalue) if len(x) and len(y) else 1.0
            test = "Mann-Whitney U"
        effect = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
        n_pairs, enough, data = 0, min(len(x), len(y)) >= min_seeds, (x, y)
    c = Comparison("pair", a, b, endpoint, test, paired, len(ga), len(gb), n_pairs, effect, p, _data=data)
    if not enough:
        c.family, c.verdict = "none", TOO_FEW
    return c


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (module docstring)."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)))
    out = np.empty_like(adj)
    out[order] = adj
    return out


def adjust(comparisons: Sequence[Comparison], alpha: float) -> None:
    """Holm and BH within each family (in place); verdicts from Holm; Holm's step threshold per test."""
    for fam in ("primary", "exploratory"):
        members = [c for c in comparisons if c.family == fam]
        if not members:
            continue
        p = np.array([c.p for c in members])
        adj_holm, bh = holm(p), sps.false_discovery_control(p, method="bh")
        order = np.argsort(p, kind="stable")
        m = len(members)
        for rank, i in enumerate(order):
            members[i].threshold = alpha / (m - rank)
        for c, ph, qb in zip(members, adj_holm, bh):
            c.p_holm, c.q_bh = float(ph), float(qb)
            c.verdict = SEPARATES if ph < alpha else NOT_SHOWN


def hodges_lehmann(d: np.ndarray) -> float:
    """The median of the Walsh averages ``(d_i + d_j) / 2``, i <= j (NaN for no data)."""
    d = np.asarray(d, dtype=float)
    if not len(d):
        return math.nan
    i, j = np.triu_indices(len(d))
    return float(np.median((d[i] + d[j]) / 2))


def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t), t = 0..n(n+1)/2, under the null (exact, by counting subsets of ranks)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return np.cumsum(counts) / 2 ** n


def wilcoxon_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """The exact interval of the Hodges-Lehmann shift that inverts the two-sided signed-rank test at ``level``."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan, math.nan
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2)
    cdf = _signed_rank_cdf(n)
    k = int(np.searchsorted(cdf, (1 - level) / 2, side="right"))  # P(T <= k - 1) <= a/2 < P(T <= k)
    if k < 1:
        return -math.inf, math.inf
    return float(walsh[k - 1]), float(walsh[len(walsh) - k])


def mcnemar_interval(b: int, c: int, n: int, level: float) -> tuple[float, float]:
    """The rate difference's interval from the Clopper-Pearson interval of b / (b + c) (module docstring)."""
    m = b + c
    a = 1 - level
    if m == 0:  # no discordant seed: |difference| <= the discordant share, at most 1 - (a/2)^(1/n) (0 of n, exact)
        u = float(sps.beta.ppf(1 - a / 2, 1, n)) if n > 0 else 1.0
        return -u, u
    lo = sps.beta.ppf(a / 2, b, c + 1) if b > 0 else 0.0
    hi = sps.beta.ppf(1 - a / 2, b + 1, c) if c > 0 else 1.0
    return m / n * (2 * lo - 1), m / n * (2 * hi - 1)


def intervals(comparisons: Sequence[Comparison], alpha: float, reps: int, seed: int) -> None:
    """The effects' intervals at the family's simultaneous level (in place; module docstring)."""
    sizes = {fam: sum(c.family == fam for c in comparisons) for fam in ("primary", "exploratory")}
    for c in comparisons:
        if c.kind != "pair" or not c._data:
            continue
        level = 1 - alpha / max(1, sizes.get(c.family, 1))
        x, y = c._data
        if c.paired and c.endpoint == "collapse":
            c.lo, c.hi = mcnemar_interval(int(np.sum((x == 1) & (y == 0))), int(np.sum((x == 0) & (y == 1))),
                                          len(x), level)
        elif c.paired:
            c.lo, c.hi = wilcoxon_interval(x - y, level)
        elif c.endpoint == "collapse":
            iv = newcombe_diff(int(x.sum()), len(x), int(y.sum()), len(y), level)
            c.lo, c.hi = iv.lo, iv.hi
        elif min(len(x), len(y)) >= 2:
            rng = data_rng(seed, [x], [y])
            boots = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(1) - \
                y[rng.integers(0, len(y), size=(reps, len(y)))].mean(1)
            c.lo, c.hi = (float(v) for v in np.quantile(boots, [(1 - level) / 2, (1 + level) / 2]))


def horizon(comparisons: Sequence[Comparison], groups: dict[str, pd.DataFrame], min_seeds: int) -> None:
    """For collapse tests: the same test on the runs' verdicts with the last 5% / 10% of steps cut (in place)."""
    for c in comparisons:
        if c.kind != "pair" or c.endpoint != "collapse":
            continue
        for cut, col in (("h95", "collapsed_h95"), ("h90", "collapsed_h90")):
            ga, gb = groups[c.a], groups[c.b]
            if col not in ga:
                continue
            short = compare_pair(ga.assign(collapsed=ga[col]), gb.assign(collapsed=gb[col]), c.a, c.b, "collapse",
                                 c.paired, min_seeds)
            setattr(c, f"p_{cut}", short.p)
            if c.verdict == SEPARATES:
                setattr(c, f"holds_{cut}", "yes" if short.p <= c.threshold else "no")


def trend_comparisons(measures: pd.DataFrame, families: dict[str, list[tuple[float, str]]], min_seeds: int,
                      reps: int, seed: int, paired: Iterable[str] = ()) -> list[Comparison]:
    """A collapse trend (Cochran-Armitage) and a final-reward trend (Page when the levels share every seed, else
    Jonckheere-Terpstra) per ordered family ``{name: [(x, label), ...]}``. A family named in ``paired`` (a primary
    trend: paired by design, docs/preregistration.md section 6) is tested on the seeds every level holds, both
    endpoints, Page's L for the reward, even where a level lost a seed; the others of the levels' runs are left
    out (their number is the gap between ``n_a``, the smallest level, and ``n_pairs``)."""
    from .trend import cochran_armitage, jonckheere, page

    out, paired = [], set(paired)
    for name, levels in families.items():
        levels = sorted(levels)
        gs = [measures[measures["label"] == lab] for _, lab in levels]
        seeds = [set(g["seed"]) for g in gs]
        common = sorted(set.intersection(*seeds))
        n_min = min(len(g) for g in gs)
        blocked = len(common) >= min_seeds and (name in paired or all(len(s) == len(common) for s in seeds))
        if blocked:
            gs = [g[g["seed"].isin(common)] for g in gs]  # a no-op unless a primary trend lost a run
        desc = "<".join(f"{x:g}" for x, _ in levels)
        ca = cochran_armitage([x for x, _ in levels], [g["collapsed"].astype(bool).to_numpy() for g in gs])
        if blocked:
            blocks = np.stack([g.drop_duplicates("seed").set_index("seed").loc[common, "final"].to_numpy(float)
                               for g in gs], axis=1)
            rank = page(blocks[np.isfinite(blocks).all(axis=1)])
        else:
            rank = jonckheere([g["final"].to_numpy(float) for g in gs], reps, seed)
        for endpoint, res, pr in (("collapse", ca, False), ("final", rank, blocked)):
            eff = 1.0 if res.direction == "up" else -1.0 if res.direction == "down" else 0.0
            c = Comparison("trend", name, desc, endpoint, res.test, pr, n_min, len(levels), len(common) if pr else 0,
                           eff, res.p)
            if n_min < min_seeds:
                c.family, c.verdict = "none", TOO_FEW
            out.append(c)
    return out


def _key(c: Comparison) -> tuple:
    """How a primary contrast names the comparison: ``("pair", a, b)`` (sorted) or ``("trend", family)``."""
    return ("trend", c.a) if c.kind == "trend" else ("pair", *sorted((c.a, c.b)))


def verdicts(measures: pd.DataFrame, labels: Sequence[str], runs: pd.DataFrame | None = None, *,
             alpha: float = 0.05, min_seeds: int = 5, endpoints: Iterable[str] = ("collapse", "final"),
             primary: Iterable[tuple] = (), trends: dict[str, list[tuple[float, str]]] | None = None,
             reps: int = 10_000, seed: int = 0, versus: str | None = None) -> list[Comparison]:
    """Every comparison of the report: each pair of groups on each endpoint, then the trends; families, Holm/BH,
    verdicts, intervals and the horizon check. ``primary``: pairs ``(a, b)`` and trends ``("trend", name)`` declared
    before the runs (their tests form the primary family). ``versus``: compare every group against this one only
    (a many-to-one family, as Dunnett's design) instead of every pair."""
    groups = {lab: measures[measures["label"] == lab].drop_duplicates("seed").set_index("seed") for lab in labels}
    out: list[Comparison] = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if versus is not None and versus not in (a, b):
                continue
            paired = pairs_on_seeds(runs, a, b)
            for ep in endpoints:
                out.append(compare_pair(groups[a], groups[b], a, b, ep, paired, min_seeds))
    prim = {("trend", p[1]) if p[0] == "trend" else ("pair", *sorted(p)) for p in primary}
    out += trend_comparisons(measures, trends or {}, min_seeds, reps, seed,
                             paired={k[1] for k in prim if k[0] == "trend"})
    for c in out:
        if c.family != "none" and _key(c) in prim:
            c.family = "primary"
    adjust(out, alpha)
    intervals(out, alpha, reps, seed)
    horizon(out, groups, min_seeds)
    return out


def frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    return pd.DataFrame([c.row() for c in comparisons])
