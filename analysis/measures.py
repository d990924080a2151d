"""Per-run measures: the definitions of docs/design.md section 5, in one module.

Notation: a run's reward history ``r[i]`` at logged steps ``step[i]`` (i = 0..T-1, sorted),
``S[i]`` its smoothed reward, parameters from :class:`analysis.config.AnalysisConfig`.

- **Smoothed reward** ``S``, **peak**, **final** and the noise sd: the one definition of
  :mod:`harness.curves` (centred moving average over W steps, or EMA; peak = ``max_i S[i]`` and its
  step; final = mean of the last ``final_window`` finite raw rewards; sigma = ``median|diff r| /
  0.6745 / sqrt 2``). **R0** = ``S[0]``. **Drop** = peak - final. **AUC** = trapezoid area of the
  finite raw reward over steps divided by the step span (the mean reward over the run).
- **Collapse: the drop-from-peak rule v2** (:func:`detect`). Running peak ``P[i] = max_{j<=i} S[j]``;
  noise sd of the smoothed curve ``sigma_S = sigma / sqrt W``; margin
  ``m[i] = max(z sigma_S, f (P[i] - R0))`` (``collapse_noise_z`` z, ``collapse_gain_frac`` f): both
  terms are in the run's own units, so the rule is scale-free. ``below[i] = S[i] < P[i] - m[i]``.
  Stretches of ``below`` separated by fewer than ``collapse_gap`` steps are joined into episodes;
  episodes shorter than ``collapse_persist`` logged steps are ignored. An episode that reaches the
  last step, when the median of the last ``collapse_persist`` raw rewards is also below the line (the
  run ends down there: the centred window alone would smear a 2-step drop over W/2 steps), is a
  **persistent collapse**; one that ends earlier (the
  smoothed reward came back within the margin of its peak) is a **transient dip**. A run with a
  persistent collapse is ``collapsed`` (``collapse_kind = "persistent"``); a run with dips only is
  ``"transient"`` (reported, not a collapse: ``dips``, ``dip_step``); else ``"stable"``. An
  episode's **onset** is the first step of its descent: walking back from its first step while
  ``S < P - 3m/4``. A non-finite ``policy/loss`` or reward at step s is a persistent collapse at s
  (``onset_kind = "nonfinite"``); the earlier of the two wins. A run with neither is censored at its
  last step.
- **Change-point estimate**: ``ruptures.KernelCPD(kernel="linear")`` (least-squares mean shifts) on
  the finite raw rewards with penalty ``cp_pen_scale * sigma^2 * ln T``; the estimate is the first
  step of the first segment starting after the peak whose mean is more than the rule's margin at the
  peak, ``max(z sigma_S, f (peak - R0))``, below the previous segment's mean. Reported beside the
  rule, never instead of it.
- **Horizon robustness**: ``collapsed_h95`` / ``collapsed_h90`` = the collapse verdict (rule and non-finite
  values) on the same run with its last 5% / 10% of logged steps cut; ``late`` = a collapse whose onset lies in
  the last 10% of the run's step span (``onset >= first + 0.9 (last - first)``). A verdict that needs the last
  tenth of a 300-step run is weaker evidence than one at mid-run; the reports count them apart.
- **Convergence step**: first ``step[i]`` with ``S[i] >= R0 + tau * (target - R0)``; target = the best
  group IQM of the final reward in the comparison (:func:`convergence_target`). Censored at the last
  step if never reached, and undefined (censored) when ``target <= R0``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from harness import curves
from harness import metrics as M
from harness.collapse import (PERSISTENT, STABLE, TRANSIENT, Detection, collapse_onset_index,  # noqa: F401
                              detect, rule_margin)

from .config import AnalysisConfig
from .load import Experiment
from .stats import iqm

MEASURE_COLUMNS = (
    "run_id", "label", "seed", "first_step", "last_step", "n_steps", "r0", "peak", "peak_step", "final", "drop",
    "auc", "noise_sd", "margin", "collapsed", "collapse_kind", "onset", "onset_kind", "dips", "dip_step", "cp_onset",
    "collapse_time", "target", "converged", "converge_step",
    "converge_time", "kl_mean", "step_time", "coverage_mean", "collapsed_h95", "collapsed_h90", "late",
)
#: horizon robustness: the collapse verdict again on the curve cut by these fractions of its logged steps
HORIZON_CUTS = {"collapsed_h95": 0.05, "collapsed_h90": 0.10}
#: a collapse whose onset lies in the last LATE_FRAC of the run's steps is *late*: a different kind of evidence
LATE_FRAC = 0.1


def smooth(values: np.ndarray, window: int, kind: str = "centred") -> np.ndarray:
    """Smoothed series (:func:`harness.curves.smooth`: the one definition)."""
    return curves.smooth(values, window, kind)


def first_nonfinite_step(steps: np.ndarray, values: np.ndarray) -> float:
    """First step whose logged value is NaN or +-inf; NaN when there is none."""
    bad = ~np.isfinite(np.asarray(values, dtype=float))
    return float(steps[np.argmax(bad)]) if bad.any() else math.nan


def noise_scale(x: np.ndarray) -> float:
    """Robust per-step noise sd (:func:`harness.curves.noise_sd`), 1e-6 for a constant curve."""
    return curves.noise_sd(x) or 1e-6


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
    """Mean of the last ``window`` finite rewards (:func:`harness.curves.final`)."""
    return curves.final(values, window)


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
        "peak_step": math.nan, "final": math.nan, "drop": math.nan, "auc": math.nan, "noise_sd": math.nan,
        "margin": math.nan, "collapsed": False, "collapse_kind": STABLE, "onset": math.nan, "onset_kind": "",
        "dips": 0, "dip_step": math.nan, "cp_onset": math.nan, "collapse_time": math.nan,
        "collapsed_h95": False, "collapsed_h90": False, "late": False,
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
    out["drop"] = out["peak"] - out["final"]
    out["auc"] = auc(steps, values)

    det = detect(values, cfg)
    out.update(noise_sd=det.sigma, margin=det.margin, dips=len(det.dips),
               dip_step=float(steps[det.dips[0]]) if det.dips else math.nan)
    onset, kind = (float(steps[det.onset]), "drop") if det.onset is not None else (math.nan, "")
    bad = [first_nonfinite_step(steps, values)]
    if len(loss):
        bad.append(first_nonfinite_step(loss.index.to_numpy(), loss.to_numpy(dtype=float)))
    bad = [b for b in bad if not math.isnan(b)]
    if bad and (math.isnan(onset) or min(bad) <= onset):
        onset, kind = min(bad), "nonfinite"
    collapsed = not math.isnan(onset)
    out.update(collapsed=collapsed, collapse_kind=PERSISTENT if collapsed else det.kind, onset=onset, onset_kind=kind)
    span = out["last_step"] - out["first_step"]
    out["late"] = bool(collapsed and span > 0 and onset >= out["first_step"] + (1 - LATE_FRAC) * span)
    for col, frac in HORIZON_CUTS.items():
        keep = len(steps) - int(math.ceil(frac * len(steps)))
        out[col] = _collapsed_by(steps[:keep], values[:keep], loss[loss.index <= steps[keep - 1]] if keep else loss.iloc[:0],
                                 cfg) if keep > 0 else False
    # the censoring time of the survival analysis: onset, or the last step the run reached
    last = max(out["last_step"], float(loss.index.max()) if len(loss) else -math.inf)
    out["collapse_time"] = onset if collapsed else last

    ok = np.isfinite(values)
    if ok.sum() >= 2 and finite_S.any():
        peak_in_finite = int(np.searchsorted(steps[ok], out["peak_step"]))
        min_drop = rule_margin(det.sigma, out["peak"] - r0, cfg)
        j = changepoint_onset_index(values[ok], peak_in_finite, cfg.cp_pen_scale, cfg.cp_min_size, min_drop)
        if j is not None:
            out["cp_onset"] = float(steps[ok][j])
    return out


def _collapsed_by(steps: np.ndarray, values: np.ndarray, loss: pd.Series, cfg: AnalysisConfig) -> bool:
    """The collapse verdict (rule v2 or a non-finite reward/loss) of a run whose history ends at ``steps[-1]``."""
    if detect(values, cfg).onset is not None or not math.isnan(first_nonfinite_step(steps, values)):
        return True
    return len(loss) > 0 and not math.isnan(first_nonfinite_step(loss.index.to_numpy(), loss.to_numpy(dtype=float)))


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
        cov = exp.series(M.MOE_REPLAY_COVERAGE, run.run_id).to_numpy(dtype=float)
        cov = cov[np.isfinite(cov)]
        row["coverage_mean"] = float(cov.mean()) if len(cov) else math.nan  # multi-turn runs only
        rows.append(row)
        if len(reward):
            smoothed[run.run_id] = (reward.index.to_numpy(), smooth(reward.to_numpy(float), cfg.smooth_window, cfg.smooth_kind))
    frame = pd.DataFrame(rows, columns=[c for c in MEASURE_COLUMNS if c not in ("target", "converged", "converge_step", "converge_time")])
    frame = add_convergence(frame, smoothed, cfg, target)
    return frame[list(MEASURE_COLUMNS)]
