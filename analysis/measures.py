"""Per-run measures: the pre-registered definitions of DESIGN.md section 5, in one module.

Notation: a run's reward history ``r[i]`` at logged steps ``step[i]`` (i = 0..T-1, sorted),
``S[i]`` its smoothed reward, parameters from :class:`analysis.config.AnalysisConfig`.

- **Smoothed reward** ``S``: centred moving average over W steps (``S[i] = mean r[i-W//2 .. i+W-W//2-1]``,
  partial windows at the ends, non-finite values ignored) or an EMA with alpha = 2/(W+1).
- **R0** = ``S[0]``, the smoothed reward at the first logged step.
- **Peak** = ``max_i S[i]`` (and its step); **final** = mean of the finite raw rewards over the last
  ``final_window`` logged steps; **AUC** = trapezoid area of the finite raw reward over steps divided
  by the step span (the mean reward over the run, comparable across run lengths).
- **Collapse onset** (drop-from-peak rule): with the running peak ``P[i] = max_{j<=i} S[j]`` and
  margin ``m[i] = max(delta_abs, delta_rel * (P[i] - R0))``, the onset is ``step[i]`` for the first i
  such that ``S[j] < P[j] - m[j]`` for all j in i..i+H-1 (H consecutive logged steps; a stretch cut
  short by the end of the run does not count). A non-finite ``policy/loss`` or reward at step s is a
  collapse at s (``onset_kind = "nonfinite"``); the earlier of the two wins. A run with neither is
  censored at its last step.
- **Change-point estimate**: ``ruptures.KernelCPD(kernel="linear")`` (least-squares mean shifts) on
  the finite raw rewards with penalty ``cp_pen_scale * sigma^2 * ln T``, sigma =
  ``median|diff r| / 0.6745 / sqrt 2`` (robust noise scale); the estimate is the first step of the
  first segment starting after the peak whose mean is more than ``cp_min_drop`` below the previous
  segment's mean. Reported beside the rule, never instead of it.
- **Convergence step**: first ``step[i]`` with ``S[i] >= R0 + tau * (target - R0)``; target = the best
  group IQM of the final reward in the comparison (:func:`convergence_target`). Censored at the last
  step if never reached, and undefined (censored) when ``target <= R0``.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from .config import AnalysisConfig
from .load import Experiment
from .stats import iqm

MEASURE_COLUMNS = (
    "run_id", "label", "seed", "first_step", "last_step", "n_steps", "r0", "peak", "peak_step", "final", "auc",
    "collapsed", "onset", "onset_kind", "cp_onset", "collapse_time", "target", "converged", "converge_step",
    "converge_time", "kl_mean", "step_time",
)


def smooth(values: np.ndarray, window: int, kind: str = "centred") -> np.ndarray:
    """Smoothed series (non-finite inputs ignored; NaN only where no finite value is in reach)."""
    x = np.asarray(values, dtype=float)
    x = np.where(np.isfinite(x), x, np.nan)
    s = pd.Series(x)
    if kind == "centred":
        out = s.rolling(window, center=True, min_periods=1).mean()
    elif kind == "ema":
        out = s.ewm(span=window, adjust=True, ignore_na=True).mean()
    else:
        raise ValueError(f"unknown smoothing {kind!r}")
    return out.to_numpy()


def first_nonfinite_step(steps: np.ndarray, values: np.ndarray) -> float:
    """First step whose logged value is NaN or +-inf; NaN when there is none."""
    bad = ~np.isfinite(np.asarray(values, dtype=float))
    return float(steps[np.argmax(bad)]) if bad.any() else math.nan


def drop_onset_index(smoothed: np.ndarray, r0: float, delta_rel: float, delta_abs: float, hold: int) -> int | None:
    """Index of the collapse onset by the drop-from-peak rule, or None (see module docstring)."""
    s = np.asarray(smoothed, dtype=float)
    if len(s) < hold or not np.isfinite(r0):
        return None
    peak = np.fmax.accumulate(np.where(np.isfinite(s), s, -np.inf))
    margin = np.maximum(delta_abs, delta_rel * (peak - r0))
    below = np.isfinite(s) & (s < peak - margin)
    counts = np.concatenate([[0], np.cumsum(below)])
    full = counts[hold:] - counts[:-hold] == hold  # full[i]: below[i..i+hold-1] all True
    return int(np.argmax(full)) if full.any() else None


def noise_scale(x: np.ndarray) -> float:
    """Robust per-step noise sd: median |first difference| / 0.6745 / sqrt(2)."""
    d = np.abs(np.diff(x))
    sigma = float(np.median(d)) / 0.6745 / math.sqrt(2) if len(d) else 0.0
    if sigma <= 0:
        sigma = float(np.std(x)) or 1e-6
    return sigma


def changepoint_onset_index(x: np.ndarray, peak_index: int, pen_scale: float, min_size: int, min_drop: float) -> int | None:
    """Index of the first downward break after ``peak_index`` in ``x`` (finite values), or None."""
    import ruptures as rpt

    x = np.asarray(x, dtype=float)
    T = len(x)
    if T < 2 * min_size:
        return None
    pen = pen_scale * noise_scale(x) ** 2 * math.log(T)
    bkps = rpt.KernelCPD(kernel="linear", min_size=min_size).fit(x.reshape(-1, 1)).predict(pen=pen)
    bounds = [0, *[int(b) for b in bkps]]
    if bounds[-1] != T:
        bounds.append(T)
    for k in range(1, len(bounds) - 1):
        b = bounds[k]
        if b <= peak_index:
            continue
        before = x[bounds[k - 1]:b].mean()
        after = x[b:bounds[k + 1]].mean()
        if after < before - min_drop:
            return b
    return None


def convergence_index(smoothed: np.ndarray, r0: float, target: float, tau: float) -> int | None:
    """Index of the first smoothed value >= R0 + tau (target - R0); None if never or target <= R0."""
    if not (np.isfinite(target) and np.isfinite(r0)) or target <= r0:
        return None
    hit = np.asarray(smoothed) >= r0 + tau * (target - r0)
    return int(np.argmax(hit)) if hit.any() else None


def final_reward(values: np.ndarray, window: int) -> float:
    """Mean of the last ``window`` finite rewards."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    return float(x[-window:].mean()) if len(x) else math.nan


def auc(steps: np.ndarray, values: np.ndarray) -> float:
    """Trapezoid area of the finite rewards over steps / step span (the single value for one point)."""
    ok = np.isfinite(values)
    st, x = np.asarray(steps, dtype=float)[ok], np.asarray(values, dtype=float)[ok]
    if len(x) == 0:
        return math.nan
    if len(x) == 1 or st[-1] == st[0]:
        return float(x.mean())
    return float(np.trapezoid(x, st) / (st[-1] - st[0]))


def measure_run(reward: pd.Series, loss: pd.Series, cfg: AnalysisConfig) -> dict:
    """Every target-free measure of one run (convergence comes later, in :func:`add_convergence`)."""
    empty = {
        "first_step": math.nan, "last_step": math.nan, "n_steps": 0, "r0": math.nan, "peak": math.nan,
        "peak_step": math.nan, "final": math.nan, "auc": math.nan, "collapsed": False, "onset": math.nan,
        "onset_kind": "", "cp_onset": math.nan, "collapse_time": math.nan,
    }
    if not len(reward):
        return empty
    steps = reward.index.to_numpy()
    values = reward.to_numpy(dtype=float)
    S = smooth(values, cfg.smooth_window, cfg.smooth_kind)
    finite_S = np.isfinite(S)
    out = dict(empty)
    out.update(first_step=float(steps[0]), last_step=float(steps[-1]), n_steps=len(steps))
    if not finite_S.any():
        r0 = math.nan
    else:
        r0 = float(S[np.argmax(finite_S)])
        pk = int(np.nanargmax(S))
        out.update(r0=r0, peak=float(S[pk]), peak_step=float(steps[pk]))
    out["final"] = final_reward(values, cfg.final_window)
    out["auc"] = auc(steps, values)

    onset, kind = math.nan, ""
    i = drop_onset_index(S, r0, cfg.collapse_delta_rel, cfg.collapse_delta_abs, cfg.collapse_hold)
    if i is not None:
        onset, kind = float(steps[i]), "drop"
    bad = [first_nonfinite_step(steps, values)]
    if len(loss):
        bad.append(first_nonfinite_step(loss.index.to_numpy(), loss.to_numpy(dtype=float)))
    bad = [b for b in bad if not math.isnan(b)]
    if bad and (math.isnan(onset) or min(bad) <= onset):
        onset, kind = min(bad), "nonfinite"
    out.update(collapsed=not math.isnan(onset), onset=onset, onset_kind=kind)
    # the censoring time of the survival analysis: onset, or the last step the run reached
    last = max(out["last_step"], float(loss.index.max()) if len(loss) else -math.inf)
    out["collapse_time"] = onset if out["collapsed"] else last

    ok = np.isfinite(values)
    if ok.sum() >= 2 and finite_S.any():
        peak_in_finite = int(np.searchsorted(steps[ok], out["peak_step"]))
        j = changepoint_onset_index(values[ok], peak_in_finite, cfg.cp_pen_scale, cfg.cp_min_size, cfg.cp_min_drop)
        if j is not None:
            out["cp_onset"] = float(steps[ok][j])
    return out


def convergence_target(measures: pd.DataFrame) -> float:
    """The best group IQM of the final reward (the plateau the comparison can reach)."""
    per_group = [iqm(g["final"].dropna().to_numpy()) for _, g in measures.groupby("label", sort=False)]
    per_group = [v for v in per_group if np.isfinite(v)]
    return max(per_group) if per_group else math.nan


def add_convergence(measures: pd.DataFrame, smoothed: Mapping[str, tuple[np.ndarray, np.ndarray]],
                    cfg: AnalysisConfig, target: float | None = None) -> pd.DataFrame:
    """Add target, converged, converge_step, converge_time (censored at the last step)."""
    measures = measures.copy()
    target = convergence_target(measures) if target is None else target
    conv, step, time_ = [], [], []
    for row in measures.itertuples():
        steps, S = smoothed.get(row.run_id, (np.array([]), np.array([])))
        i = convergence_index(S, row.r0, target, cfg.converge_tau) if len(S) else None
        conv.append(i is not None)
        step.append(float(steps[i]) if i is not None else math.nan)
        time_.append(float(steps[i]) if i is not None else row.last_step)
    measures["target"] = target
    measures["converged"] = conv
    measures["converge_step"] = step
    measures["converge_time"] = time_
    return measures


def measure_experiment(exp: Experiment, cfg: AnalysisConfig, target: float | None = None) -> pd.DataFrame:
    """One row per training run with every measure (columns :data:`MEASURE_COLUMNS`)."""
    rows, smoothed = [], {}
    for run in exp.runs.itertuples():
        reward = exp.series(cfg.reward_metric, run.run_id)
        loss = exp.series(cfg.loss_metric, run.run_id)
        row = {"run_id": run.run_id, "label": run.label, "seed": run.seed, **measure_run(reward, loss, cfg)}
        kl = exp.series(cfg.kl_metric, run.run_id).to_numpy(dtype=float)
        kl = kl[np.isfinite(kl)]
        row["kl_mean"] = float(kl.mean()) if len(kl) else math.nan
        tm = exp.series(cfg.time_metric, run.run_id).to_numpy(dtype=float)
        tm = tm[np.isfinite(tm)]
        row["step_time"] = float(tm.mean()) if len(tm) else math.nan
        rows.append(row)
        if len(reward):
            smoothed[run.run_id] = (reward.index.to_numpy(), smooth(reward.to_numpy(float), cfg.smooth_window, cfg.smooth_kind))
    frame = pd.DataFrame(rows, columns=[c for c in MEASURE_COLUMNS if c not in ("target", "converged", "converge_step", "converge_time")])
    frame = add_convergence(frame, smoothed, cfg, target)
    return frame[list(MEASURE_COLUMNS)]
