"""Per-run definitions against synthetic curves with known answers.

Tolerances (stated): the drop-from-peak onset lies within W/2 = 5 steps of the true drop step (the
centred window sees the drop up to W/2 steps early); the change-point estimate within 3 steps.
Stable, slowly converging and never-learning curves are never flagged. The benchmark of the rule
(1200 labelled curves) is tested in ``test_benchmark.py``.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.config import AnalysisConfig
from analysis.measures import (
    add_convergence,
    auc,
    changepoint_onset_index,
    convergence_index,
    detect,
    final_reward,
    measure_run,
    smooth,
)
from analysis.synthetic import curve

CFG = AnalysisConfig()
SEEDS = range(12)


def series(x) -> pd.Series:
    x = np.asarray(x, dtype=float)
    return pd.Series(x, index=pd.Index(np.arange(len(x)), name="step"))


def finite_loss(T: int) -> pd.Series:
    return series(np.zeros(T))


def test_smooth_centred_and_ema_known_values():
    x = np.array([0, 0, 0, 10, 0, 0, 0], float)
    s = smooth(x, 3, "centred")
    np.testing.assert_allclose(s, [0, 0, 10 / 3, 10 / 3, 10 / 3, 0, 0])
    # partial windows at the ends, NaN/inf ignored
    s = smooth(np.array([1.0, np.nan, 3.0, np.inf]), 3, "centred")
    np.testing.assert_allclose(s, [1.0, 2.0, 3.0, 3.0])
    e = smooth(np.array([0.0, 1.0]), 3, "ema")  # alpha = 0.5, adjusted weights 1, 0.5
    np.testing.assert_allclose(e, [0.0, 1.0 / 1.5])


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.08])
@pytest.mark.parametrize("seed", SEEDS)
def test_ramp_plateau_drop_found_at_known_step(seed, noise):
    drop_at = 300
    r = curve(500, r0=0.2, plateau=0.8, ramp=80, drop_at=drop_at, drop_to=0.3, noise=noise, seed=seed)
    m = measure_run(series(r), finite_loss(500), CFG)
    assert m["collapsed"] and m["onset_kind"] == "drop"
    assert abs(m["onset"] - drop_at) <= CFG.smooth_window // 2, m["onset"]
    assert abs(m["cp_onset"] - drop_at) <= 3, m["cp_onset"]
    assert m["collapse_time"] == m["onset"]
    # the peak of the smoothed curve is a maximum over the plateau's smoothed noise (sd noise / sqrt W)
    assert m["peak"] == pytest.approx(0.8, abs=0.01 + 4 * noise / math.sqrt(CFG.smooth_window))
    assert m["final"] == pytest.approx(0.3, abs=0.01 + 4 * noise / math.sqrt(CFG.final_window))


@pytest.mark.parametrize("seed", SEEDS)
def test_never_collapsing_runs_are_not_flagged(seed):
    for r in (
        curve(500, r0=0.2, plateau=0.8, ramp=80, noise=0.05, seed=seed),  # ramp then plateau
        curve(500, r0=0.3, plateau=0.3, noise=0.05, seed=seed),  # never learns: peak is a noise maximum
        curve(500, r0=0.2, plateau=0.8, tau=150, noise=0.05, seed=seed),  # slow convergence
    ):
        m = measure_run(series(r), finite_loss(500), CFG)
        assert not m["collapsed"], m
        assert math.isnan(m["onset"]) and math.isnan(m["cp_onset"])
        assert m["collapse_time"] == 499  # censored at the last step


def test_nan_loss_is_a_collapse_at_that_step():
    r = curve(200, noise=0.03, seed=0)
    loss = np.zeros(200)
    loss[137:] = np.nan
    m = measure_run(series(r), series(loss), CFG)
    assert m["collapsed"] and m["onset"] == 137 and m["onset_kind"] == "nonfinite"
    inf_loss = np.zeros(200)
    inf_loss[42] = np.inf
    m = measure_run(series(r), series(inf_loss), CFG)
    assert m["onset"] == 42 and m["onset_kind"] == "nonfinite"


def test_earlier_of_drop_and_nan_wins():
    r = curve(300, drop_at=100, noise=0.03, seed=1)
    loss = np.zeros(300)
    loss[250:] = np.nan
    m = measure_run(series(r), series(loss), CFG)
    assert m["onset_kind"] == "drop" and abs(m["onset"] - 100) <= 5
    loss[:] = 0
    loss[60] = np.nan
    m = measure_run(series(r), series(loss), CFG)
    assert m["onset_kind"] == "nonfinite" and m["onset"] == 60


def test_recovered_dip_is_transient_and_a_drop_at_the_end_is_persistent():
    # a dip that comes back to the plateau is a transient dip, reported but not a collapse
    r = curve(300, noise=0.02, seed=2)
    r[150:190] = 0.3
    m = measure_run(series(r), finite_loss(300), CFG)
    assert not m["collapsed"] and m["collapse_kind"] == "transient" and m["dips"] == 1
    assert abs(m["dip_step"] - 150) <= CFG.smooth_window // 2
    # a drop 10 steps before the run ends (published curves stop once a run collapsed) counts
    r = curve(200, drop_at=190, noise=0.02, seed=3)
    m = measure_run(series(r), finite_loss(200), CFG)
    assert m["collapsed"] and m["collapse_kind"] == "persistent" and abs(m["onset"] - 190) <= 5
    # ... given the minimum persistence: 2 low steps at the very end are not enough
    r = curve(200, drop_at=198, noise=0.02, seed=3)
    assert not measure_run(series(r), finite_loss(200), CFG)["collapsed"]
    # a dip, a recovery, then a collapse that lasts: persistent, onset at the second drop, one dip
    r = curve(400, noise=0.02, seed=4)
    r[150:190] = 0.3
    r[300:] = 0.3 + np.random.default_rng(0).normal(0, 0.02, 100)
    m = measure_run(series(r), finite_loss(400), CFG)
    assert m["collapsed"] and abs(m["onset"] - 300) <= 5 and m["dips"] == 1


def test_rule_is_scale_free():
    """The margin comes from the run's own noise and gain: a curve and any a*r + b (a > 0) get the
    same verdict and onset, while a fixed margin in reward units would not."""
    for seed in range(6):
        r = curve(300, r0=0.2, plateau=0.8, ramp=60, drop_at=200, drop_to=0.6, noise=0.05, seed=seed)
        d = detect(r, CFG)
        for a, b in ((0.1, 0.0), (0.1, 0.45), (10.0, -3.0)):
            e = detect(a * r + b, CFG)
            assert (e.kind, e.onset, e.dips) == (d.kind, d.onset, d.dips)
            assert e.margin == pytest.approx(a * d.margin)
        assert d.kind == "persistent"  # a drop of a third of the gain


def test_margin_parameters():
    s = np.r_[np.linspace(0.2, 0.8, 50), np.full(50, 0.8), np.full(30, 0.7)]  # exact, noise-free: sigma = 0
    # gain 0.6: margin = 0.2 * 0.6 = 0.12 > drop 0.1 -> stable
    assert detect(s, CFG).kind == "stable"
    # f = 0.15: margin 0.09 < 0.1 -> collapse at the drop (within W/2 steps: the centred window blurs it)
    d = detect(s, AnalysisConfig(collapse_gain_frac=0.15))
    assert d.kind == "persistent" and abs(d.onset - 100) <= CFG.smooth_window // 2
    # persistence longer than the low stretch -> none
    assert detect(s, AnalysisConfig(collapse_gain_frac=0.15, collapse_persist=40)).kind == "stable"


@pytest.mark.parametrize("shape", ["linear", "exponential"])
def test_slow_convergence_step_matches_the_clean_curve(shape):
    """First passage of the smoothed reward through R0 + tau (target - R0), against the noise-free
    curve's crossing t*. Tolerance: noise / slope near t* decides it (20 steps for the 400-step ramp at
    noise 0.03, 30 for the exponential approach, whose slope near t* is ~10x smaller, at noise 0.01)."""
    T, target = 500, 0.8
    for seed in SEEDS:
        if shape == "linear":
            r, tol = curve(T, r0=0.2, plateau=0.8, ramp=400, noise=0.03, seed=seed), 20
        else:
            r, tol = curve(T, r0=0.2, plateau=0.8, tau=150.0, noise=0.01, seed=seed), 30
        S = smooth(r, CFG.smooth_window)
        r0 = S[0]
        i = convergence_index(S, r0, target, CFG.converge_tau)
        thr = r0 + CFG.converge_tau * (target - r0)
        t_star = (thr - 0.2) / 0.6 * 400 if shape == "linear" else -150.0 * math.log((0.8 - thr) / 0.6)
        assert i is not None and abs(i - t_star) <= tol, (i, t_star)
        assert not measure_run(series(r), finite_loss(T), CFG)["collapsed"]


def test_convergence_censored_when_never_reached_and_undefined_below_r0():
    r = curve(100, r0=0.2, plateau=0.5, noise=0.01, seed=0)
    frame = pd.DataFrame([{"run_id": "a", "label": "x", "seed": 0, **measure_run(series(r), finite_loss(100), CFG)}])
    smoothed = {"a": (np.arange(100), smooth(r, 10))}
    out = add_convergence(frame, smoothed, CFG, target=0.9)
    assert not out["converged"].iloc[0] and math.isnan(out["converge_step"].iloc[0])
    assert out["converge_time"].iloc[0] == 99
    assert convergence_index(np.array([0.5, 0.6]), r0=0.5, target=0.4, tau=0.9) is None
    out = add_convergence(frame, smoothed, CFG)  # target = this group's IQM final (0.5)
    assert out["converged"].iloc[0] and out["target"].iloc[0] == pytest.approx(0.5, abs=0.01)


def test_changepoint_ignores_breaks_before_the_peak():
    x = np.r_[np.full(50, 0.2), np.full(50, 0.8), np.full(50, 0.5)] + np.random.default_rng(0).normal(0, 0.02, 150)
    assert changepoint_onset_index(x, peak_index=60, pen_scale=3, min_size=5, min_drop=0.05) == 100
    assert changepoint_onset_index(x, peak_index=60, pen_scale=3, min_size=5, min_drop=0.35) is None
    assert changepoint_onset_index(x, peak_index=120, pen_scale=3, min_size=5, min_drop=0.05) is None
    assert changepoint_onset_index(x[:6], 0, 3, 5, 0.05) is None  # too short


def test_final_auc_and_empty_run():
    x = np.r_[np.zeros(10), np.ones(10)]
    assert final_reward(x, 10) == 1.0
    assert final_reward(np.r_[x, np.nan], 5) == 1.0
    assert auc(np.arange(5), np.full(5, 0.4)) == pytest.approx(0.4)
    assert auc(np.array([0, 10]), np.array([0.0, 1.0])) == pytest.approx(0.5)
    m = measure_run(pd.Series(dtype=float), pd.Series(dtype=float), CFG)
    assert m["n_steps"] == 0 and not m["collapsed"] and math.isnan(m["final"])
