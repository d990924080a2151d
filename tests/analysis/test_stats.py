"""Across-seed statistics: IQM, stratified bootstrap CIs (reproducible, calibrated), probability of
improvement, Kaplan-Meier, Wilson."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis.stats import (
    bootstrap_ci,
    curve_band,
    iqm,
    iqm_ci,
    kaplan_meier,
    km_median,
    nan_iqm,
    newcombe_diff,
    prob_improvement_point,
    probability_of_improvement,
    survival_at,
    wilson,
)


def true_iqm_exponential() -> float:
    """IQM of Exp(1): 2 * integral_{q1}^{q3} x e^-x dx, q1 = ln 4/3, q3 = ln 4."""
    q1, q3 = math.log(4 / 3), math.log(4)
    return 2 * ((q1 + 1) * math.exp(-q1) - (q3 + 1) * math.exp(-q3))


def test_iqm_known_values():
    assert iqm(np.arange(1, 9)) == pytest.approx(4.5)  # drops 1, 2 and 7, 8
    assert iqm(np.array([0.0, 0.0, 0.0, 100.0])) == pytest.approx(0.0)  # drops 0 and 100
    assert iqm(np.array([1.0, 2.0, 3.0])) == pytest.approx(2.0)  # N < 4: the mean
    assert math.isnan(iqm(np.array([])))
    x = np.array([[1.0, 2.0, 3.0, 4.0, np.nan], [5.0, 1.0, 9.0, 2.0, 3.0]])
    np.testing.assert_allclose(nan_iqm(x, axis=1), [iqm(np.array([1.0, 2, 3, 4])), iqm(x[1])])


def test_bootstrap_is_reproducible_with_a_seed():
    x = np.random.default_rng(1).exponential(size=20)
    a, b = iqm_ci(x, reps=2000, seed=7), iqm_ci(x, reps=2000, seed=7)
    assert (a.point, a.lo, a.hi) == (b.point, b.lo, b.hi)
    c = iqm_ci(x, reps=2000, seed=8)
    assert (c.lo, c.hi) != (a.lo, a.hi)
    assert a.lo <= a.point <= a.hi
    band1, band2 = curve_band(np.random.default_rng(0).normal(size=(5, 30)), 200, seed=3), \
        curve_band(np.random.default_rng(0).normal(size=(5, 30)), 200, seed=3)
    for u, v in zip(band1, band2):
        np.testing.assert_array_equal(u, v)


def test_bootstrap_ci_covers_the_true_iqm_at_the_nominal_rate():
    """300 samples of n=40 from Exp(1); the 95% CI should cover the true IQM in ~95% of them.
    The percentile bootstrap of a trimmed mean of a skewed law is a little liberal at n=40; with 300
    repetitions the binomial sd is 1.3 points, so [0.89, 0.99] is a 4-sd window around ~0.94."""
    truth = true_iqm_exponential()
    rng = np.random.default_rng(12345)
    hits = 0
    reps = 300
    for k in range(reps):
        x = rng.exponential(size=40)
        ci = iqm_ci(x, reps=1000, ci=0.95, seed=k)
        hits += ci.lo <= truth <= ci.hi
    coverage = hits / reps
    assert 0.89 <= coverage <= 0.99, coverage
    # a 50% interval covers about half the time: the check has teeth
    hits50 = sum(
        (lambda c: c.lo <= truth <= c.hi)(iqm_ci(np.random.default_rng(10_000 + k).exponential(size=40), 1000, 0.5, k))
        for k in range(200)
    )
    assert 0.38 <= hits50 / 200 <= 0.62


def test_stratified_bootstrap_resamples_within_strata():
    zeros, ones = np.zeros(5), np.ones(5)
    mean = lambda r: r.mean(axis=1)  # noqa: E731
    strat = bootstrap_ci([zeros, ones], mean, reps=2000, seed=0)
    assert strat.point == strat.lo == strat.hi == 0.5  # every resample keeps 5 zeros and 5 ones
    pooled = bootstrap_ci(np.r_[zeros, ones], mean, reps=2000, seed=0)
    assert pooled.lo < 0.5 < pooled.hi
    single = iqm_ci(np.array([0.3]))
    assert single.point == 0.3 and math.isnan(single.lo)


def test_probability_of_improvement():
    assert prob_improvement_point(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert prob_improvement_point(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.5
    rng = np.random.default_rng(0)
    d = 1.0
    x, y = rng.normal(d, 1, 300), rng.normal(0, 1, 300)
    truth = sps.norm.cdf(d / math.sqrt(2))
    iv = probability_of_improvement(x, y, reps=500, seed=0)
    assert abs(iv.point - truth) < 0.04 and iv.lo <= truth <= iv.hi
    again = probability_of_improvement(x, y, reps=500, seed=0)
    assert (again.lo, again.hi) == (iv.lo, iv.hi)
    # strata are averaged: one task where X wins, one where it loses -> 0.5
    both = probability_of_improvement([np.array([1.0, 1.1]), np.array([0.0, 0.1])],
                                      [np.array([0.0, 0.1]), np.array([1.0, 1.1])], reps=200)
    assert both.point == 0.5


def test_kaplan_meier_textbook_example():
    durations = np.array([2, 3, 3, 5, 7], float)
    events = np.array([1, 1, 0, 1, 0], bool)
    t, s = kaplan_meier(durations, events)
    np.testing.assert_allclose(t, [0, 2, 3, 5])
    np.testing.assert_allclose(s, [1.0, 0.8, 0.6, 0.3])
    np.testing.assert_allclose(survival_at(np.array([0, 1, 2, 4, 6, 100]), durations, events),
                               [1.0, 1.0, 0.8, 0.6, 0.3, 0.3])
    assert km_median(durations, events) == 5
    assert math.isnan(km_median(np.array([5.0, 6.0]), np.array([False, False])))


def test_wilson_interval_known_values():
    w = wilson(0, 3)
    assert w.point == 0 and w.lo == 0 and w.hi == pytest.approx(0.5615, abs=1e-3)
    w = wilson(5, 10)
    assert w.lo == pytest.approx(0.2366, abs=1e-3) and w.hi == pytest.approx(0.7634, abs=1e-3)


def test_curve_band_shapes_and_degenerate_cases():
    v = np.tile(np.linspace(0, 1, 20), (4, 1))
    c, lo, hi = curve_band(v, 100, seed=0)
    np.testing.assert_allclose(c, v[0])
    np.testing.assert_allclose(lo, v[0])
    np.testing.assert_allclose(hi, v[0])
    c, lo, hi = curve_band(v[:1], 100)
    assert np.isnan(lo).all() and np.allclose(c, v[0])
    v2 = v.copy()
    v2[1:, 10:] = np.nan  # only one run left after step 10: no band there
    c, lo, hi = curve_band(v2, 100)
    assert np.isnan(lo[10:]).all() and np.isfinite(lo[:10]).all()


def test_newcombe_difference_matches_the_paper():
    # Newcombe (1998), Stat. Med. 17:873, Table II, method 10: 56/70 - 48/80 -> [0.0524, 0.3339]; 9/10 - 3/10 -> [0.1705, 0.8090]
    iv = newcombe_diff(56, 70, 48, 80)
    assert iv.point == pytest.approx(0.2) and iv.lo == pytest.approx(0.0524, abs=1e-4) and iv.hi == pytest.approx(0.3339, abs=1e-4)
    iv = newcombe_diff(9, 10, 3, 10)
    assert (iv.lo, iv.hi) == (pytest.approx(0.1705, abs=1e-4), pytest.approx(0.8090, abs=1e-4))
    assert np.isnan(newcombe_diff(0, 0, 1, 2).point)


def test_an_interval_depends_on_its_data_only_not_on_order_or_neighbours():
    """The same runs give the same CI wherever they appear: in any order, as any group of a report (the
    raw and processed arms of a run that ignores logprobs_mode had CIs differing in the last digit), and
    whatever groups sit beside them; other data gives another stream."""
    rng = np.random.default_rng(3)
    a = rng.normal(0.8, 0.05, 10)
    ci = iqm_ci(a, 2000, 0.95, 0)
    assert iqm_ci(a[::-1].copy(), 2000, 0.95, 0) == ci
    assert iqm_ci(rng.permutation(a), 2000, 0.95, 0) == ci
    strata = [a[:5], a[5:]]
    assert iqm_ci(strata, 2000, 0.95, 0) == iqm_ci(strata[::-1], 2000, 0.95, 0)
    b = a.copy()
    b[0] += 1e-9  # a different run set: a different stream (the point moves by ~1e-10 at most)
    other = iqm_ci(b, 2000, 0.95, 0)
    assert (other.lo, other.hi) != (ci.lo, ci.hi)
    assert iqm_ci(a, 2000, 0.95, 1) != ci  # the seed still selects the stream
    x, y = rng.normal(0, 1, 8), rng.normal(0.5, 1, 8)
    assert probability_of_improvement(x, y, 2000) == probability_of_improvement(x[::-1].copy(), rng.permutation(y), 2000)
    runs = rng.normal(0, 1, (6, 40))
    band = curve_band(runs, 200)
    for got, want in zip(curve_band(runs[::-1].copy(), 200), band):
        np.testing.assert_array_equal(got, want)
