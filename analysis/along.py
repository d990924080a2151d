"""Training diagnostics along the run, per arm: how far each arm moves its policy per step, how often PPO clips, and
what train-inference noise it trained under.

Per run: the mean over its logged steps of each metric of :data:`ALONG` (finite values); per group: the median over
its seeds with the interquartile range in brackets. Issue 31's conservative-update control reads ``policy/update_norm``
and ``policy/clipfrac`` (docs/preregistration.md section 4: does mean_8 help by its denominator or by damping the
update?); ``mismatch/abs_diff`` and ``noise/var_rollout`` are the noise probe's diff and var_rollout along training
(KwaiKAT's MoE row: 0.008 and 1e-3), ``mismatch/rec_k3`` the KL a held run holds, ``moe/routing_flip_rate`` the share
of tokens routed to another expert set.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from harness import metrics as M

from .config import AnalysisConfig
from .load import Experiment
from .tables import Table

ALONG = (M.POLICY_UPDATE_NORM, M.POLICY_CLIPFRAC, M.POLICY_GRAD_NORM, M.MISMATCH_REC_K3, M.MISMATCH_ABS_DIFF,
         M.NOISE_VAR_ROLLOUT, M.MOE_ROUTING_FLIP_RATE)


def run_means(exp: Experiment, metric: str, run_ids: list[str]) -> np.ndarray:
    """The mean over each run's finite logged values of ``metric`` (NaN for a run that logged none)."""
    out = []
    for r in run_ids:
        v = exp.series(metric, r).to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        out.append(float(v.mean()) if v.size else np.nan)
    return np.asarray(out)


def along_table(exp: Experiment, cfg: AnalysisConfig) -> Table | None:
    """The table (module docstring), or None when no run logged any of :data:`ALONG`."""
    present = [m for m in ALONG if exp.has_metric(m)]
    if not present or exp.runs.empty:
        return None
    cells, data = [], []
    for label in exp.labels:
        ids = exp.group_runs(label)
        cell, row = {"group": label, "seeds": str(len(ids))}, {"group": label, "seeds": len(ids)}
        for m in present:
            x = run_means(exp, m, ids)
            x = x[np.isfinite(x)]
            med, q1, q3 = (np.median(x), *np.percentile(x, [25, 75])) if x.size else (np.nan,) * 3
            row.update({m: med, f"{m} q1": q1, f"{m} q3": q3})
            cell[m] = f"{med:.3g} [{q1:.3g}, {q3:.3g}]" if x.size else "-"
        cells.append(cell)
        data.append(row)
    footer = ("Per run: the mean of the metric over its logged steps; per group: the median over seeds [interquartile "
              "range]. Metrics: docs/metrics.md. KwaiKAT's MoE row: diff (mismatch/abs_diff) 0.008, var_rollout 1e-3.")
    return Table(name="along", title="Along training: update size, clipping and noise per arm",
                 frame=pd.DataFrame(cells), data=pd.DataFrame(data), footer=footer,
                 short_footer="median over seeds of the per-run mean [IQR]")
