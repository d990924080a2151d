"""analysis/survival.py on synthetic data with known hazards (fixed seeds): the stratified Cox interval covers the
true hazard ratio, the stratified log-rank p is uniform under the null, RMST matches the exponential's analytic
value, a known logistic's ED50 and two arms' ED50 ratio are recovered with covering intervals, the interaction of a
known dose x arm hazard is recovered; zero-event arms get a limiting interval, never a point; and the tail rule on
hand-made curves."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis.config import AnalysisConfig
from analysis.measures import detect, measure_run
from analysis.stats import km_median
from analysis.survival import (censor, cox_hr, critical_dose, critical_dose_ratio, dose_interaction, endpoint,
                               endpoints, kaplan_meier, logrank, paired_rmst_difference, rmst, share)

CFG = AnalysisConfig()


def paired_exponential(rng, seeds: int, hr: float, horizon: float):
    """One run per (arm, seed): hazard lam_s (a seed's own baseline, lognormal: a frailty the strata absorb) for
    arm A, hr x lam_s for arm B; censored at ``horizon``."""
    lam = np.exp(rng.normal(0.0, 1.0, seeds))
    seed = np.repeat(np.arange(seeds), 2)
    arm = np.tile([0, 1], seeds)
    t = rng.exponential(1.0 / (lam[seed] * np.where(arm == 1, hr, 1.0)))
    return np.minimum(t, horizon), t <= horizon, arm, seed


# ---- Cox, log-rank -----------------------------------------------------------------------------------------------

def test_cox_hr_interval_covers_the_true_hazard_ratio_in_about_95_percent_of_replications():
    rng = np.random.default_rng(42)
    reps, true = 150, 2.0
    cover = 0
    for _ in range(reps):
        t, e, a, s = paired_exponential(rng, 32, true, horizon=1.0)
        hr = cox_hr(t, e, a, s)
        assert hr.method == "wald" and hr.lo < hr.point < hr.hi
        cover += hr.lo <= true <= hr.hi
    # 95 % of 150 = 142.5, binomial sd 2.7: within 3 sd
    assert 134 <= cover <= 150, cover


def test_logrank_p_is_uniform_under_the_null():
    """With one run per (arm, seed) the stratified statistic is discrete (each seed says which arm failed first), so
    its p is checked by rate, P(p <= alpha) = alpha within 3 binomial sd at three levels, not by a KS test."""
    rng = np.random.default_rng(7)
    reps = 400
    ps = np.array([logrank(*paired_exponential(rng, 64, 1.0, horizon=1.0)).p for _ in range(reps)])
    for alpha in (0.05, 0.1, 0.5):
        assert abs((ps <= alpha).mean() - alpha) <= 3 * math.sqrt(alpha * (1 - alpha) / reps), alpha


def test_logrank_and_cox_see_a_real_effect():
    t, e, a, s = paired_exponential(np.random.default_rng(3), 64, 3.0, horizon=1.0)
    assert logrank(t, e, a, s).p < 1e-3
    assert cox_hr(t, e, a, s).lo > 1.5


def test_a_zero_event_arm_gets_the_profile_interval_never_a_point():
    t, e, a, s = paired_exponential(np.random.default_rng(5), 32, 1.0, horizon=1.0)
    e = e & (a == 0)
    t = np.where(a == 1, 1.0, t)
    hr = cox_hr(t, e, a, s)
    assert hr.method == "profile" and hr.events_b == 0 and hr.point == 0.0 and hr.lo == 0.0
    assert 0.0 < hr.hi < 1.0  # bounded above: B's hazard is demonstrably lower
    # the upper bound is where the profile log-likelihood is chi2_1(0.95)/2 below its limit
    from statsmodels.duration.hazard_regression import PHReg
    model = PHReg(t, a[:, None].astype(float), status=e.astype(int), strata=s, ties="efron")
    drop = model.loglike(np.array([-30.0])) - model.loglike(np.array([math.log(hr.hi)]))
    assert drop == pytest.approx(sps.chi2.ppf(0.95, 1) / 2, abs=1e-6)
    assert "[0, " in hr.fmt() and "profile" in hr.fmt()
    # the mirror: no events in A, [L, inf]
    flip = cox_hr(t, e, 1 - a, s)
    assert flip.point == math.inf and flip.hi == math.inf and flip.lo == pytest.approx(1 / hr.hi, rel=1e-6)
    assert logrank(t, e, a, s).p < 0.01  # the log-rank test is valid with a zero-event arm


def test_events_in_both_arms_but_b_always_first_is_a_monotone_likelihood_too():
    s = np.repeat(np.arange(8), 2)
    a = np.tile([0, 1], 8)
    hr = cox_hr(np.where(a == 1, 10.0 + s, 20.0 + s), np.ones(16, bool), a, s)  # in every seed B fails first
    assert (hr.events_a, hr.events_b, hr.method, hr.point, hr.hi) == (8, 8, "profile", math.inf, math.inf)
    assert 1.0 < hr.lo < math.inf and hr.p < 0.01


def test_no_events_in_either_arm_is_said_so():
    t, _, a, s = paired_exponential(np.random.default_rng(1), 8, 1.0, horizon=1.0)
    none = np.zeros_like(a, dtype=bool)
    assert cox_hr(t, none, a, s).fmt() == "no events"
    assert math.isnan(logrank(t, none, a, s).p)


# ---- KM, share, RMST ---------------------------------------------------------------------------------------------

def test_kaplan_meier_median_and_clopper_pearson_share():
    t = np.array([10, 20, 30, 40, 50, 60.0])
    e = np.array([1, 1, 1, 0, 0, 0], bool)
    km = kaplan_meier(t, e)
    assert km.surv.tolist() == pytest.approx([1, 5 / 6, 4 / 6, 3 / 6])
    assert km.median == 30.0 == km_median(t, e)  # the house convention: first S <= 0.5
    assert math.isnan(kaplan_meier(t, np.zeros(6, bool)).median)
    iv = share(3, 8)
    assert (iv.lo, iv.hi) == pytest.approx((sps.beta.ppf(0.025, 3, 6), sps.beta.ppf(0.975, 4, 5)))
    assert share(0, 8).lo == 0.0 and share(0, 8).hi == pytest.approx(1 - 0.025 ** (1 / 8))


def test_rmst_equals_the_exponential_analytic_value():
    lam, H, n = 1.5, 1.0, 4000
    t = np.random.default_rng(11).exponential(1 / lam, n)
    iv = rmst(t, np.ones(n, bool), H)
    truth = (1 - math.exp(-lam * H)) / lam
    assert iv.lo <= truth <= iv.hi
    assert abs(iv.point - truth) < 0.01
    # without censoring before H, RMST is the mean restricted time
    assert iv.point == pytest.approx(np.minimum(t, H).mean(), rel=1e-12)


def test_rmst_with_censoring_before_the_horizon_matches_the_analytic_value():
    rng = np.random.default_rng(12)
    lam, H, n = 1.0, 1.5, 6000
    x, c = rng.exponential(1 / lam, n), rng.uniform(0.5, 3.0, n)
    iv = rmst(np.minimum(x, c), x <= c, H)
    assert iv.lo <= (1 - math.exp(-lam * H)) / lam <= iv.hi


def test_paired_rmst_difference_is_the_difference_of_arm_rmsts():
    t, e, a, s = paired_exponential(np.random.default_rng(9), 40, 2.0, horizon=1.0)
    A = pd.DataFrame({"seed": s[a == 0], "time": t[a == 0], "event": e[a == 0]})
    B = pd.DataFrame({"seed": s[a == 1], "time": t[a == 1], "event": e[a == 1]})
    pd_ = paired_rmst_difference(A, B, 1.0)
    assert pd_.pairs == 40 and pd_.dropped == 0
    assert pd_.diff.point == pytest.approx(rmst(B.time, B.event, 1.0).point - rmst(A.time, A.event, 1.0).point)
    assert pd_.diff.hi < 0 and pd_.p < 0.05
    # a run censored before H has an unknown restricted time: its pair is left out and counted
    B.loc[0, ["time", "event"]] = [0.2, False]
    assert paired_rmst_difference(A, B, 1.0).dropped == 1


def test_paired_rmst_difference_without_events_has_no_interval():
    A = pd.DataFrame({"seed": range(8), "time": 1.0, "event": False})
    out = paired_rmst_difference(A, A.copy(), 1.0)
    assert out.diff.point == 0 and math.isnan(out.diff.lo) and "no events" in out.note


# ---- critical dose -----------------------------------------------------------------------------------------------

DOSES = np.array([0.25, 0.5, 1.0, 2.0, 4.0])


def logistic_events(rng, ed50: float, slope: float = 2.0, per_dose: int = 40):
    d = np.repeat(DOSES, per_dose)
    p = 1 / (1 + np.exp(-slope * (np.log(d) - math.log(ed50))))
    return d, rng.random(len(d)) < p


def test_ed50_of_a_known_logistic_is_recovered_and_fieller_covers():
    rng = np.random.default_rng(21)
    reps, cover, points = 150, 0, []
    for _ in range(reps):
        cd = critical_dose(*logistic_events(rng, 1.5))
        assert cd.bounded
        cover += cd.lo <= 1.5 <= cd.hi
        points.append(cd.point)
    assert abs(np.median(points) / 1.5 - 1) < 0.05
    assert 0.90 * reps <= cover <= 0.99 * reps + 1, cover  # 95 %: 142.5 expected, sd 2.7


def test_critical_dose_ratio_covers_the_true_factor():
    rng = np.random.default_rng(22)
    reps, cover = 100, 0
    for _ in range(reps):
        a = critical_dose(*logistic_events(rng, 0.8))
        b = critical_dose(*logistic_events(rng, 1.6))
        f = critical_dose_ratio(a, b)
        cover += f.lo <= 2.0 <= f.hi
    assert 0.88 * reps <= cover <= reps, cover


def test_critical_dose_without_a_glm_estimate_says_where_it_lies():
    assert critical_dose([1, 2, 4, 8], [0, 0, 0, 0]).fmt() == "no events: > 8"
    assert critical_dose([1, 2, 4, 8], [1, 1, 1, 1]).fmt() == "all collapsed: < 1"
    sep = critical_dose([1, 1, 2, 2, 4, 4, 8, 8], [0, 0, 0, 0, 1, 1, 1, 1])
    assert (sep.lo, sep.hi) == (2, 4) and "separated" in sep.note
    flat = critical_dose(np.repeat([1.0, 2.0], 8), [1, 0, 0, 0, 0, 0, 0, 1] * 2)  # no dose-response
    assert not flat.bounded and flat.hi == math.inf and "unbounded" in flat.fmt()
    assert critical_dose_ratio(flat, flat).hi == math.inf
    assert math.isnan(critical_dose_ratio(sep, flat).point)
    # doses <= 0 (the no-noise control) are no point of a log-dose curve
    d, e = logistic_events(np.random.default_rng(1), 1.0)
    with_zero = critical_dose(np.r_[d, np.zeros(40)], np.r_[e, np.ones(40, bool)])
    assert with_zero.point == critical_dose(d, e).point


def test_dose_interaction_recovers_a_known_interaction():
    rng = np.random.default_rng(31)
    true, reps, cover, seeds = 0.7, 60, 0, 24
    doses = np.array([0.5, 1.0, 2.0])
    for _ in range(reps):
        lam = np.exp(rng.normal(0, 0.5, seeds))
        s, a, d = (x.ravel() for x in np.meshgrid(np.arange(seeds), [0, 1], doses, indexing="ij"))
        haz = lam[s] * d ** 0.5 * np.exp(0.3 * a + true * a * np.log(d))
        t = rng.exponential(1 / haz)
        out = dose_interaction(np.minimum(t, 1.0), t <= 1.0, a, d, s)
        assert out.estimable
        cover += out.lo <= true <= out.hi
    assert 52 <= cover <= reps, cover  # 95 % of 60 = 57, binomial sd 1.7: within 3 sd


def test_dose_interaction_of_a_monotone_likelihood_is_not_estimable():
    s = np.repeat(np.arange(6), 4)
    a = np.tile([0, 0, 1, 1], 6)
    d = np.tile([1.0, 2.0, 1.0, 2.0], 6)
    e = (a == 0)  # only arm A collapses
    out = dose_interaction(np.where(e, 5.0, 10.0), e, a, d, s)
    assert not out.estimable and "not estimable" in out.fmt()


# ---- the endpoint and its unscored tail, on hand-made curves -----------------------------------------------------

H, TAIL = 300, 150
STEPS = np.arange(H + TAIL)


def series(values) -> pd.Series:
    return pd.Series(np.asarray(values, float), index=pd.Index(STEPS[:len(values)], name="step"))


def made(drop_at: int | None = None, recover_at: int | None = None, noise_seed: int = 0) -> np.ndarray:
    """Ramp 0.2 -> 0.8 over 60 steps; a drop to 0.3 at ``drop_at``, back to 0.8 at ``recover_at``."""
    x = 0.2 + 0.6 * np.minimum(STEPS / 60, 1.0)
    if drop_at is not None:
        x[drop_at:recover_at] = 0.3
    return x + np.random.default_rng(noise_seed).normal(0, 0.01, len(STEPS))


NO_LOSS = pd.Series(dtype=float)


def test_a_dip_open_at_the_horizon_that_recovers_in_the_tail_is_not_an_event():
    x = made(drop_at=H - 30, recover_at=H + 60)
    assert detect(x[:H + 1], CFG).collapsed  # cut at H, it would look like a collapse
    assert endpoint(series(x), NO_LOSS, H, CFG) == (H, False)


def test_a_collapse_that_starts_in_the_tail_is_censored_at_the_horizon():
    x = made(drop_at=H + 40)
    assert measure_run(series(x), NO_LOSS, CFG)["collapsed"]  # the whole curve collapses ...
    assert endpoint(series(x), NO_LOSS, H, CFG) == (H, False)  # ... after H


def test_a_collapse_before_the_horizon_is_an_event_at_its_onset():
    x = made(drop_at=H - 120)
    t, e = endpoint(series(x), NO_LOSS, H, CFG)
    assert e and H - 130 <= t <= H - 115


def test_a_non_finite_loss_is_an_event_before_the_horizon_and_censored_after():
    x = made()
    for at, expect in ((H - 100, (H - 100, True)), (H + 10, (H, False))):
        loss = np.zeros(len(STEPS))
        loss[at:] = np.nan
        assert endpoint(series(x), series(loss), H, CFG) == expect


def test_a_run_that_stopped_early_is_censored_at_its_last_step():
    assert endpoint(series(made()[:H - 50]), NO_LOSS, H, CFG) == (H - 51, False)
    assert censor(math.nan, False, H + TAIL - 1, H) == (H, False)


def test_endpoints_of_a_measures_frame():
    m = pd.DataFrame({"run_id": ["a", "b", "c"], "onset": [100.0, 320.0, math.nan],
                      "collapsed": [True, True, False], "last_step": [449.0, 449.0, 449.0]})
    out = endpoints(m, H)
    assert out["time"].tolist() == [100.0, H, H] and out["event"].tolist() == [True, False, False]
    assert out["tail"].tolist() == [149.0] * 3
    from analysis.load import AnalysisError
    with pytest.raises(AnalysisError, match="--horizon"):
        endpoints(m, 0)
