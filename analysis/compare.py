"""``python -m analysis compare``: two groups of one experiment, head to head.

A group is named by its full label (``mean_n(n=8)``, ``tis(C=2,token)``) or by an estimator name when
that estimator has exactly one group in the experiment (``mean_n``). For the final reward, the peak
reward and the AUC it prints each group's IQM with its stratified bootstrap CI and the probability of
improvement P(A > B) with its CI (strata = tasks); for collapse, the counts, Wilson CIs and
Kaplan-Meier median onsets; for convergence, the counts and Kaplan-Meier median steps. The measures
(and the convergence target, the best group IQM of the final reward in the whole experiment) are
those of the report, so the two agree.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .config import AnalysisConfig
from .load import AnalysisError, Experiment
from .stats import iqm_ci, km_median, probability_of_improvement, wilson
from .tables import Table, fmt_step

MEASURES = (("final", "final reward"), ("peak", "peak reward"), ("auc", "AUC (mean reward)"))


def resolve_group(exp: Experiment, name: str) -> str:
    """The group label that ``name`` designates; AnalysisError listing the groups otherwise."""
    labels = exp.labels
    if name in labels:
        return name
    matches = [lab for lab in labels if exp.runs.loc[exp.runs["label"] == lab, "estimator"].iloc[0] == name]
    if len(matches) == 1:
        return matches[0]
    listing = "\n  ".join(labels) or "(none)"
    if matches:
        raise AnalysisError(f"{name!r} matches several groups in {exp.name!r}; name one of:\n  " + "\n  ".join(matches))
    raise AnalysisError(f"no group {name!r} in experiment {exp.name!r}; groups there:\n  {listing}")


def _strata(measures: pd.DataFrame, exp: Experiment, label: str, column: str) -> dict[str, object]:
    m = measures[measures["label"] == label].merge(exp.runs[["run_id", "task"]], on="run_id")
    return {task: g[column].to_numpy(float) for task, g in m.groupby("task", sort=True)}


def compare_table(exp: Experiment, measures: pd.DataFrame, a: str, b: str, cfg: AnalysisConfig) -> Table:
    """The comparison of groups ``a`` and ``b`` (labels) as a :class:`Table`."""
    rows, data = [], []
    for column, title in MEASURES:
        sa, sb = _strata(measures, exp, a, column), _strata(measures, exp, b, column)
        ia = iqm_ci(list(sa.values()), cfg.bootstrap_reps, cfg.ci, cfg.seed)
        ib = iqm_ci(list(sb.values()), cfg.bootstrap_reps, cfg.ci, cfg.seed)
        tasks = sorted(set(sa) & set(sb))
        poi = probability_of_improvement([sa[t] for t in tasks], [sb[t] for t in tasks],
                                         cfg.bootstrap_reps, cfg.ci, cfg.seed)
        few = min(sum(np.isfinite(v).sum() for v in sa.values()), sum(np.isfinite(v).sum() for v in sb.values())) < 2
        rows.append({"measure": title, f"A = {a}": ia.fmt(), f"B = {b}": ib.fmt(),
                     "P(A > B)": "n/a (< 2 seeds)" if few else poi.fmt(2)})
        data.append({"measure": column, "a": a, "b": b, "a_iqm": ia.point, "a_lo": ia.lo, "a_hi": ia.hi,
                     "b_iqm": ib.point, "b_lo": ib.lo, "b_hi": ib.hi, "poi": poi.point, "poi_lo": poi.lo,
                     "poi_hi": poi.hi})
    ga, gb = measures[measures["label"] == a], measures[measures["label"] == b]
    wa = wilson(int(ga["collapsed"].sum()), len(ga), cfg.ci)
    wb = wilson(int(gb["collapsed"].sum()), len(gb), cfg.ci)
    rows.append({"measure": "collapsed (rate [CI])", f"A = {a}": f"{int(ga['collapsed'].sum())}/{len(ga)} ({wa.fmt(2)})",
                 f"B = {b}": f"{int(gb['collapsed'].sum())}/{len(gb)} ({wb.fmt(2)})", "P(A > B)": ""})
    ma = km_median(ga["collapse_time"].to_numpy(float), ga["collapsed"].to_numpy(bool))
    mb = km_median(gb["collapse_time"].to_numpy(float), gb["collapsed"].to_numpy(bool))
    rows.append({"measure": "onset (KM median)", f"A = {a}": fmt_step(ma), f"B = {b}": fmt_step(mb), "P(A > B)": ""})
    ca = km_median(ga["converge_time"].to_numpy(float), ga["converged"].to_numpy(bool))
    cb = km_median(gb["converge_time"].to_numpy(float), gb["converged"].to_numpy(bool))
    rows.append({"measure": "converged", f"A = {a}": f"{int(ga['converged'].sum())}/{len(ga)}",
                 f"B = {b}": f"{int(gb['converged'].sum())}/{len(gb)}", "P(A > B)": ""})
    rows.append({"measure": "conv. step (KM median)", f"A = {a}": fmt_step(ca), f"B = {b}": fmt_step(cb),
                 "P(A > B)": ""})
    data.append({"measure": "collapse_rate", "a": a, "b": b, "a_iqm": wa.point, "a_lo": wa.lo, "a_hi": wa.hi,
                 "b_iqm": wb.point, "b_lo": wb.lo, "b_hi": wb.hi})
    t = Table(f"compare_{a}_vs_{b}", f"{a} (A) vs {b} (B) in {exp.name}", pd.DataFrame(rows), pd.DataFrame(data),
              cfg.describe(), short_footer=cfg.describe_short())
    target = float(measures["target"].iloc[0]) if len(measures) else float("nan")
    t.notes.append(f"convergence target (best group IQM of the final reward in the experiment) = {target:.3f}.")
    t.notes.append(f"A: {len(ga)} runs, B: {len(gb)} runs; P(A > B) = Mann-Whitney probability that a run of A beats a "
                   "run of B (ties count 1/2), averaged over tasks.")
    if min(len(ga), len(gb)) < 2:
        t.notes.append("a group has a single run: confidence intervals need >= 2 seeds per group.")
    return t
