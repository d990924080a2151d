"""Survival endpoints and their tests: time to collapse with an unscored tail, Kaplan-Meier, seed-stratified
log-rank and Cox, restricted mean survival time, and the critical dose (docs/analysis.md, "Survival").

Notation: run i of arm a (0 = A, 1 = B) and seed s; H the horizon (the last scored step); the run's reward
and loss histories run past H by an unscored tail (docs/preregistration_v4.md: 1500 + 150 steps).

- **Endpoint** (:func:`endpoint`, :func:`endpoints`): the collapse verdict and onset of
  :func:`analysis.measures.measure_run` (drop rule v2 with its persistence rule, or the first non-finite
  reward/loss, the earlier) on the run's **whole** curve, tail included; then
  ``event = collapsed and onset <= H``, ``time = onset`` for an event, else ``time = min(H, last step)``
  (censored). So a dip still open at H that recovers in the tail is no event (the whole curve shows it
  recover), and a collapse whose onset lies in the tail is censored at H. A run that stopped before H
  without collapsing (an infrastructure failure) is censored at its last step.
- **Kaplan-Meier** (:func:`kaplan_meier`, statsmodels ``SurvfuncRight``):
  ``S(t) = prod_{t_j <= t} (1 - d_j / Y_j)``; the **median** is the first t with ``S(t) <= 0.5`` (the
  convention of :func:`analysis.stats.km_median`; statsmodels' ``quantile`` uses ``<``), none when S stays
  above 0.5. **Share collapsed by H** = events / runs with its exact Clopper-Pearson interval
  (:func:`share`: ``Beta(a/2; k, n-k+1)``, ``Beta(1-a/2; k+1, n-k)``; statsmodels ``proportion_confint``,
  ``method="beta"``).
- **Seed-stratified log-rank** (:func:`logrank`, statsmodels ``survdiff(..., strata=seed)``): per seed the
  observed-minus-expected events of arm B, summed over seeds, ``chi2 = (sum O-E)^2 / sum V`` on 1 df. Valid
  with zero events in one arm; with no event at all there is nothing to test (p = n/a).
- **Cox with seed strata** (:func:`cox_hr`, statsmodels ``PHReg(time, arm, status=event, strata=seed,
  ties="efron")``): each seed has its own baseline hazard; ``HR = exp(beta)`` of B vs A, Wald interval
  ``exp(beta +- z se)`` and Wald p. When the partial likelihood is monotone (no events in one arm, or in every
  informative seed the same arm fails first) beta's estimate is -inf or +inf and Wald means nothing: the
  point is 0 (or inf) and the interval is the **profile-likelihood** one,
  ``{beta: 2 (l_sup - l(beta)) <= chi2_1(ci)}`` with ``l_sup`` the limit of the log partial likelihood
  (``[0, U]`` or ``[L, inf]``), p the likelihood-ratio test ``chi2_1 = 2 (l_sup - l(0))``. With no event in
  either arm there is no hazard ratio at all ("no events").
- **RMST** (:func:`rmst`): ``RMST(H) = int_0^H S(t) dt`` of the KM curve, variance
  ``sum_{t_j <= H} A_j^2 d_j / (Y_j (Y_j - d_j))``, ``A_j = int_{t_j}^H S(u) du`` (Klein & Moeschberger 4.5),
  normal interval. Without censoring before H it is ``mean_i min(T_i, H)``.
- **Paired RMST difference** (:func:`paired_rmst_difference`): each (arm, seed) is one run, and its
  restricted time ``min(T, H)`` is observed exactly (a run censored at H has restricted time H); so
  ``RMST_B - RMST_A = mean_s d_s``, ``d_s = min(T_Bs, H) - min(T_As, H)`` over the seeds both arms ran, with the
  **paired t interval** ``mean d +- t_{n-1} sd(d) / sqrt n`` and its p. Chosen over a Wilcoxon interval
  because its estimand is the mean difference (the RMST difference itself; Wilcoxon's is the Hodges-Lehmann
  pseudo-median, which with many tied zero differences is a different number), and over a seed bootstrap
  because the percentile bootstrap under-covers at the small seed counts of a screen. A pair with a run
  censored before H (restricted time unknown) is left out and counted; when every difference is equal (e.g.
  no events in either arm) the interval is n/a, not a zero-width point.
- **Critical dose** (:func:`critical_dose`): per arm the binomial GLM ``logit P(event by H) = b0 + b1 log d``
  (doses d > 0, statsmodels ``GLM(..., Binomial())``); ``ED50 = exp(-b0 / b1)``, its interval by **Fieller's
  theorem** on the ratio ``m = -b0 / b1``: the m with ``(b0 + m b1)^2 <= z^2 (v00 + 2 m v01 + m^2 v11)``,
  bounded when ``g = z^2 v11 / b1^2 < 1`` (the slope differs from 0), else unbounded (reported as such).
  Fieller rather than the delta method because the delta interval is symmetric in log d and wrong when the
  slope is poorly determined, which is exactly when Fieller goes unbounded; exact under the normality of
  (b0, b1), the classical choice for an ED50 (Finney). No event at any dose: ED50 > the largest dose; an event
  in every run: < the smallest; complete separation: between the two doses that separate (no GLM estimate).
- **Critical-dose ratio** (:func:`critical_dose_ratio`): ``F = ED50_B / ED50_A`` with a **parametric
  bootstrap** interval: ``reps`` draws of each arm's (b0, b1) from its fit's normal ``N(b_hat, V)``
  (``numpy.random.default_rng(seed)``), the percentile interval of ``exp(m_B - m_A)``. No closed Fieller form
  exists for a ratio of two ratios with separate slopes; when either arm's Fieller interval is unbounded, so
  is F's (reported as such).
- **Dose x estimator interaction** (:func:`dose_interaction`): Cox with seed strata on
  ``arm + log d + arm x log d`` (doses d > 0); the interaction's coefficient c is the change of log HR(B vs A)
  per unit of log dose (HR multiplies by ``e^c`` when the dose multiplies by e), Wald interval and p; when the
  fit does not converge (a monotone likelihood) the coefficient is "not estimable" and p is the
  likelihood-ratio test against the model without the interaction.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as sps

from .config import AnalysisConfig
from .measures import measure_run
from .stats import Interval

TIES = "efron"
BIG = 30.0  # |log HR| taken as the limit of a monotone partial likelihood (HR e^30)
FINITE_MAX = 15.0  # a fitted |coefficient| above this, or a non-converged fit, is a monotone likelihood


# ---- endpoint --------------------------------------------------------------------------------------------------

def censor(onset: float, collapsed: bool, last_step: float, horizon: float) -> tuple[float, bool]:
    """``(time, event)`` of one run from its whole-curve verdict (module docstring)."""
    if collapsed and np.isfinite(onset) and onset <= horizon:
        return float(onset), True
    last = float(last_step) if np.isfinite(last_step) else 0.0
    return float(min(horizon, last)), False


def endpoint(reward: pd.Series, loss: pd.Series, horizon: float, cfg: AnalysisConfig) -> tuple[float, bool]:
    """``(time, event)`` of one run from its reward and loss histories (Series indexed by step)."""
    m = measure_run(reward, loss, cfg)
    return censor(m["onset"], bool(m["collapsed"]), m["last_step"], horizon)


def endpoints(measures: pd.DataFrame, horizon: float) -> pd.DataFrame:
    """``measures`` (:func:`analysis.measures.measure_experiment`) plus ``time``, ``event`` and ``tail`` (steps
    logged past H: 0 or less means the run has no unscored tail)."""
    if not (isinstance(horizon, numbers.Real) and math.isfinite(horizon) and horizon > 0):
        from .load import AnalysisError

        raise AnalysisError(f"--horizon must be a positive number of steps, got {horizon!r}")
    out = measures.copy()
    te = [censor(r.onset, bool(r.collapsed), r.last_step, horizon) for r in measures.itertuples()]
    out["time"] = [t for t, _ in te]
    out["event"] = [e for _, e in te]
    out["tail"] = out["last_step"] - horizon
    return out


# ---- one group ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KM:
    """A Kaplan-Meier curve: ``S[k]`` holds from ``times[k]`` to ``times[k+1]`` (``times[0]`` = 0, S = 1)."""

    times: np.ndarray
    surv: np.ndarray
    median: float  # first t with S(t) <= 0.5; NaN when none
    runs: int
    events: int


def kaplan_meier(time, event) -> KM:
    """The KM curve of one group (statsmodels ``SurvfuncRight``)."""
    from statsmodels.duration.survfunc import SurvfuncRight

    t = np.asarray(time, dtype=float)
    e = np.asarray(event, dtype=bool)
    if not len(t) or not e.any():
        return KM(np.array([0.0]), np.array([1.0]), math.nan, len(t), 0)
    sf = SurvfuncRight(t, e.astype(int))
    times = np.r_[0.0, np.asarray(sf.surv_times, float)]
    surv = np.r_[1.0, np.asarray(sf.surv_prob, float)]
    hit = np.flatnonzero(surv <= 0.5 + 1e-12)  # a product of fractions that is 1/2 may round above it
    return KM(times, surv, float(times[hit[0]]) if len(hit) else math.nan, len(t), int(e.sum()))


def share(events: int, runs: int, ci: float = 0.95) -> Interval:
    """events / runs with the exact Clopper-Pearson interval (NaN for no runs)."""
    from statsmodels.stats.proportion import proportion_confint

    if runs <= 0:
        return Interval(math.nan, math.nan, math.nan)
    lo, hi = proportion_confint(int(events), int(runs), alpha=1 - ci, method="beta")
    lo = 0.0 if events == 0 else float(lo)
    hi = 1.0 if events == runs else float(hi)
    return Interval(events / runs, lo, hi)


def rmst(time, event, horizon: float, ci: float = 0.95) -> Interval:
    """Restricted mean survival time to ``horizon`` with its Greenwood-type normal interval."""
    t = np.asarray(time, dtype=float)
    e = np.asarray(event, dtype=bool)
    if not len(t):
        return Interval(math.nan, math.nan, math.nan)
    km = kaplan_meier(np.minimum(t, horizon), e & (t <= horizon))
    edges = np.r_[np.minimum(km.times, horizon), horizon]
    widths = np.diff(edges)  # S[k] holds over [times[k], times[k+1]) cut at H
    area = float((km.surv * widths).sum())
    var = 0.0
    # A_j: the area from event time t_j (km.times[j], j >= 1) to H, after the drop at t_j
    tail_area = np.cumsum((km.surv * widths)[::-1])[::-1]
    tt = np.minimum(t, horizon)
    ee = e & (t <= horizon)
    for j in range(1, len(km.times)):
        tj = km.times[j]
        if tj > horizon:
            break
        d = int(((tt == tj) & ee).sum())
        y = int((tt >= tj).sum())
        if d and y > d:
            var += tail_area[j] ** 2 * d / (y * (y - d))
    if not km.events:  # S = 1 throughout: the variance estimate is 0, which is no precision
        return Interval(area, math.nan, math.nan)
    z = float(sps.norm.ppf(0.5 + ci / 2))
    se = math.sqrt(var)
    return Interval(area, area - z * se, area + z * se)


# ---- two arms ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogRank:
    chi2: float
    p: float
    events_a: int
    events_b: int
    strata: int


def logrank(time, event, arm, strata) -> LogRank:
    """Seed-stratified log-rank of arm 1 (B) vs arm 0 (A) (statsmodels ``survdiff``)."""
    from statsmodels.duration.survfunc import survdiff

    t, e, a, s = _arrays(time, event, arm, strata)
    ea, eb = int(e[a == 0].sum()), int(e[a == 1].sum())
    if ea + eb == 0:
        return LogRank(math.nan, math.nan, 0, 0, len(np.unique(s)))
    try:
        chi2, p = survdiff(t, e.astype(int), a, strata=s)
    except np.linalg.LinAlgError:  # zero variance: every event tied across the arms within its seed (e.g. two arms
        return LogRank(0.0, 1.0, ea, eb, len(np.unique(s)))  # bitwise alike): O - E = 0, no evidence of a difference
    return LogRank(float(chi2), float(p), ea, eb, len(np.unique(s)))


@dataclass(frozen=True)
class HazardRatio:
    """HR of B vs A: ``method`` is "wald", "profile" (monotone likelihood: point 0 or inf) or "no events"."""

    point: float
    lo: float
    hi: float
    p: float
    method: str
    events_a: int
    events_b: int

    def fmt(self, digits: int = 2) -> str:
        if self.method == "no events":
            return "no events"
        f = lambda v: "inf" if v == math.inf else f"{v:.{digits}g}"  # noqa: E731
        return f"{f(self.point)} [{f(self.lo)}, {f(self.hi)}]" + (" (profile)" if self.method == "profile" else "")


def _arrays(time, event, arm, strata):
    return (np.asarray(time, float), np.asarray(event, bool), np.asarray(arm, int),
            np.asarray(pd.factorize(pd.Series(np.asarray(strata)))[0]))


def _fit(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = model.fit()
    params = np.asarray(res.params, float)
    bse = np.asarray(res.bse, float)
    converged = bool(getattr(res, "converged", True)) and bool((getattr(res, "mle_retvals", None) or {})
                                                               .get("converged", True))
    ok = converged and np.isfinite(params).all() and np.isfinite(bse).all() and (np.abs(params) < FINITE_MAX).all()
    return res, params, bse, ok


def cox_hr(time, event, arm, strata, ci: float = 0.95) -> HazardRatio:
    """HR of arm 1 (B) vs arm 0 (A), Cox with seed strata (module docstring)."""
    from statsmodels.duration.hazard_regression import PHReg

    t, e, a, s = _arrays(time, event, arm, strata)
    ea, eb = int(e[a == 0].sum()), int(e[a == 1].sum())
    if ea + eb == 0:
        return HazardRatio(math.nan, math.nan, math.nan, math.nan, "no events", 0, 0)
    model = PHReg(t, a[:, None].astype(float), status=e.astype(int), strata=s, ties=TIES)
    z = float(sps.norm.ppf(0.5 + ci / 2))
    if ea and eb:
        _, params, bse, ok = _fit(model)
        if ok:
            b, se = params[0], bse[0]
            return HazardRatio(math.exp(b), math.exp(b - z * se), math.exp(b + z * se),
                               float(2 * sps.norm.sf(abs(b / se))), "wald", ea, eb)
    ll = lambda b: float(model.loglike(np.array([b])))  # noqa: E731
    side = -1.0 if ll(-BIG) > ll(BIG) else 1.0
    sup = ll(side * BIG)
    target = sup - sps.chi2.ppf(ci, 1) / 2
    p = float(sps.chi2.sf(max(2 * (sup - ll(0.0)), 0.0), 1))
    if ll(-side * BIG) >= target:  # flat: the data cannot bound the HR on either side
        return HazardRatio(0.0 if side < 0 else math.inf, 0.0, math.inf, p, "profile", ea, eb)
    bound = optimize.brentq(lambda b: ll(b) - target, -BIG, BIG)  # ll rises from -side*BIG to side*BIG
    if side < 0:
        return HazardRatio(0.0, 0.0, math.exp(bound), p, "profile", ea, eb)
    return HazardRatio(math.inf, math.exp(bound), math.inf, p, "profile", ea, eb)


@dataclass(frozen=True)
class PairedDifference:
    """RMST_B - RMST_A over common seeds: the paired t interval; ``note`` says why an interval is n/a."""

    diff: Interval
    p: float
    pairs: int
    dropped: int
    note: str = ""


def restricted_time(time: float, event: bool, horizon: float) -> float:
    """``min(T, H)`` when known: the event time, or H for a run censored at (or after) H; NaN when censored
    before H."""
    if event:
        return float(min(time, horizon))
    return float(horizon) if time >= horizon else math.nan


def paired_rmst_difference(a: pd.DataFrame, b: pd.DataFrame, horizon: float, ci: float = 0.95) -> PairedDifference:
    """``a``, ``b``: one row per run with ``seed``, ``time``, ``event`` (module docstring)."""
    ya = {s: restricted_time(t, e, horizon) for s, t, e in zip(a["seed"], a["time"], a["event"])}
    yb = {s: restricted_time(t, e, horizon) for s, t, e in zip(b["seed"], b["time"], b["event"])}
    common = sorted(set(ya) & set(yb))
    d = np.array([yb[s] - ya[s] for s in common], float)
    dropped = int((~np.isfinite(d)).sum())
    d = d[np.isfinite(d)]
    n = len(d)
    nan = Interval(math.nan, math.nan, math.nan)
    if n == 0:
        return PairedDifference(nan, math.nan, 0, dropped, "no seed in common")
    mean = float(d.mean())
    if n < 2 or np.all(d == d[0]):
        why = "no events in either arm" if np.all(d == 0) else "every pair differs by the same amount"
        return PairedDifference(Interval(mean, math.nan, math.nan), math.nan, n, dropped,
                                why if n >= 2 else "one pair")
    se = float(d.std(ddof=1) / math.sqrt(n))
    q = float(sps.t.ppf(0.5 + ci / 2, n - 1))
    p = float(2 * sps.t.sf(abs(mean / se), n - 1))
    return PairedDifference(Interval(mean, mean - q * se, mean + q * se), p, n, dropped)


# ---- dose --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CriticalDose:
    """ED50 of one arm: ``lo``/``hi`` 0 or inf when unbounded; ``params``/``cov`` the GLM's (b0, b1) (None when
    no GLM estimate exists); ``note`` says why."""

    point: float
    lo: float
    hi: float
    note: str = ""
    params: tuple | None = None
    cov: tuple | None = None

    @property
    def bounded(self) -> bool:
        return self.params is not None and 0 < self.lo and self.hi < math.inf

    def fmt(self, digits: int = 2) -> str:
        if self.params is None:
            return self.note
        f = lambda v: "inf" if v == math.inf else f"{v:.{digits}g}"  # noqa: E731
        return f"{f(self.point)} [{f(self.lo)}, {f(self.hi)}]" + ("" if self.bounded else " (unbounded)")


def _dose_event(dose, event):
    d = np.asarray(dose, float)
    e = np.asarray(event, bool)
    keep = np.isfinite(d) & (d > 0)
    return d[keep], e[keep]


def _glm(x: np.ndarray, e: np.ndarray):
    import statsmodels.api as sm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sm.GLM(e.astype(float), sm.add_constant(x, has_constant="add"), family=sm.families.Binomial()).fit()
    return np.asarray(res.params, float), np.asarray(res.cov_params(), float)


def critical_dose(dose, event, ci: float = 0.95) -> CriticalDose:
    """The dose of 50 % collapse by H with Fieller's interval (module docstring); doses <= 0 are left out."""
    d, e = _dose_event(dose, event)
    nan = math.nan
    if len(np.unique(d)) < 2:
        return CriticalDose(nan, nan, nan, "fewer than 2 doses > 0")
    if not e.any():
        return CriticalDose(nan, float(d.max()), math.inf, f"no events: > {d.max():g}")
    if e.all():
        return CriticalDose(nan, 0.0, float(d.min()), f"all collapsed: < {d.min():g}")
    lo_event, hi_none = d[e].min(), d[~e].max()
    if hi_none < lo_event:  # complete separation: the GLM has no finite estimate
        return CriticalDose(nan, float(hi_none), float(lo_event),
                            f"separated: between {hi_none:g} and {lo_event:g}")
    x = np.log(d)
    (b0, b1), V = _glm(x, e)
    m = -b0 / b1 if b1 != 0 else math.copysign(math.inf, -b0)
    z = float(sps.norm.ppf(0.5 + ci / 2))
    # (b0 + m b1)^2 = z^2 (v00 + 2 m v01 + m^2 v11): A m^2 + B m + C = 0
    A = b1 * b1 - z * z * V[1, 1]
    B = 2 * (b0 * b1 - z * z * V[0, 1])
    C = b0 * b0 - z * z * V[0, 0]
    params, cov = (float(b0), float(b1)), tuple(map(tuple, V.tolist()))
    disc = B * B - 4 * A * C
    if A > 0 and disc >= 0:
        r = sorted(((-B - math.sqrt(disc)) / (2 * A), (-B + math.sqrt(disc)) / (2 * A)))
        return CriticalDose(_exp(m), _exp(r[0]), _exp(r[1]), "", params, cov)
    return CriticalDose(_exp(m), 0.0, math.inf, "the slope is not significantly different from 0", params, cov)


def _exp(x: float) -> float:
    """exp, inf beyond the float range (a flat dose-response puts its ED50 at a huge log dose)."""
    return math.exp(x) if x < 700 else math.inf


@dataclass(frozen=True)
class DoseRatio:
    point: float
    lo: float
    hi: float
    note: str = ""

    def fmt(self, digits: int = 2) -> str:
        if not np.isfinite(self.point):
            return self.note or "n/a"
        f = lambda v: "inf" if v == math.inf else f"{v:.{digits}g}"  # noqa: E731
        return f"{f(self.point)} [{f(self.lo)}, {f(self.hi)}]"


def critical_dose_ratio(a: CriticalDose, b: CriticalDose, ci: float = 0.95, reps: int = 20_000,
                        seed: int = 0) -> DoseRatio:
    """``F = ED50_B / ED50_A`` with the parametric-bootstrap interval (module docstring)."""
    nan = math.nan
    if a.params is None or b.params is None:
        return DoseRatio(nan, nan, nan, f"no GLM estimate ({a.note or 'A'}; {b.note or 'B'})")
    point = b.point / a.point
    if not (a.bounded and b.bounded):
        return DoseRatio(point, 0.0, math.inf, "unbounded: an arm's slope is not significantly different from 0")
    rng = np.random.default_rng(seed)
    draws = []
    for cd in (a, b):
        beta = rng.multivariate_normal(np.array(cd.params), np.array(cd.cov), size=reps)
        draws.append(-beta[:, 0] / beta[:, 1])
    log_ratio = draws[1] - draws[0]
    lo, hi = np.quantile(log_ratio, [(1 - ci) / 2, (1 + ci) / 2])
    return DoseRatio(point, float(math.exp(lo)), float(math.exp(hi)))


@dataclass(frozen=True)
class Interaction:
    """The arm x log-dose coefficient of the stratified Cox model (module docstring)."""

    coef: float
    lo: float
    hi: float
    p: float
    estimable: bool
    note: str = ""

    def fmt(self, digits: int = 2) -> str:
        if not self.estimable:
            return f"not estimable ({self.note}); LR p {self.p:.3g}" if np.isfinite(self.p) else self.note
        return f"{self.coef:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}], p {self.p:.3g}"


def dose_interaction(time, event, arm, dose, strata, ci: float = 0.95) -> Interaction:
    """Cox with seed strata on arm, log dose and their product, doses > 0 (module docstring)."""
    from statsmodels.duration.hazard_regression import PHReg

    t, e, a, s = _arrays(time, event, arm, strata)
    d = np.asarray(dose, float)
    keep = np.isfinite(d) & (d > 0)
    t, e, a, s, d = t[keep], e[keep], a[keep], s[keep], d[keep]
    nan = math.nan
    if not e.any():
        return Interaction(nan, nan, nan, nan, False, "no events")
    if len(np.unique(d)) < 2 or len(np.unique(a)) < 2:
        return Interaction(nan, nan, nan, nan, False, "needs two arms and two doses > 0")
    x = np.log(d)
    full = PHReg(t, np.column_stack([a, x, a * x]).astype(float), status=e.astype(int), strata=s, ties=TIES)
    res, params, bse, ok = _fit(full)
    z = float(sps.norm.ppf(0.5 + ci / 2))
    if ok:
        c, se = params[2], bse[2]
        return Interaction(float(c), float(c - z * se), float(c + z * se), float(2 * sps.norm.sf(abs(c / se))), True)
    reduced = PHReg(t, np.column_stack([a, x]).astype(float), status=e.astype(int), strata=s, ties=TIES)
    _, rparams, _, _ = _fit(reduced)
    lr = 2 * (full.loglike(params) - reduced.loglike(rparams))
    return Interaction(nan, nan, nan, float(sps.chi2.sf(max(lr, 0.0), 1)), False, "monotone likelihood")
