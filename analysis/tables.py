"""Tables: built from the per-run measures, written as markdown (terminal and ``.md``), CSV and LaTeX
(booktabs), each followed by the analysis parameters (:meth:`AnalysisConfig.describe`).

- ``summary``: one row per group: runs, final / peak / AUC as IQM [CI], persistent-collapse count and
  rate (Wilson CI), runs with transient dips only, Kaplan-Meier median collapse onset (rule) and median change-point onset, convergence
  count and Kaplan-Meier median convergence step, IQM of the mean ``mismatch/k3``, on multi-turn runs the IQM
  of the mean ``moe/replay_coverage``, mean seconds/step.
- ``runs``: every measure of every run (the data behind everything else).
- ``poi``: probability of improvement P(row > column) of the final reward between groups (n/a when a
  group has fewer than 2 seeds).
- ``sweep_<x>``: the groups that differ only in knob x (n or clip_c), one row per value.
- ``noise_probe``: probe runs (``probe=1``) by model, shape and perturbation beside the KwaiKAT numbers.

The CSV holds numbers (point, lo, hi in separate columns); markdown and LaTeX hold formatted cells.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness import metrics as M

from .config import AnalysisConfig
from .escape import csv_cell, md_text
from .paths import folder_name  # a --group-by key is a file name here: no path in it
from .labels import family_name, sweep_families
from .load import PROBE_METRICS, Experiment
from .stats import Interval, iqm, iqm_ci, km_median, probability_of_improvement, wilson

KWAIKAT_PROBE = M.KWAIKAT_PROBE  # KwaiKAT's noise table, from the metric catalogue


@dataclass
class Table:
    name: str
    title: str
    frame: pd.DataFrame  # formatted cells (markdown / LaTeX)
    data: pd.DataFrame  # numbers (CSV)
    footer: str = ""  # the full definitions (files)
    notes: list[str] = field(default_factory=list)
    short_footer: str = ""  # one line of parameters (terminal, report.md)

    def grid(self) -> str:
        """The bare markdown table."""
        cols = [str(c) for c in self.frame.columns]
        esc = lambda v: md_text(v).replace("|", "\\|")  # noqa: E731 - names are text, not markup (analysis.escape)
        lines = ["| " + " | ".join(esc(c) for c in cols) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|"]
        lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in self.frame.itertuples(index=False)]
        return "\n".join(lines)

    def markdown(self, with_title: bool = False, short: bool = False) -> str:
        """Markdown table followed by its notes and parameters (one line when ``short``)."""
        footer = self.short_footer if short and self.short_footer else self.footer
        tail = "\n".join([*(f"Note: {md_text(n)}" for n in self.notes), *([footer] if footer else [])])
        head = f"**{md_text(self.title)}**\n\n" if with_title else ""
        return head + self.grid() + ("\n\n" + _md_footer(tail) if tail else "")

    def latex(self) -> str:
        cols = list(self.frame.columns)
        spec = "l" + "r" * (len(cols) - 1)
        out = [
            "% requires \\usepackage{booktabs}",
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{latex_escape(self.title)}}}",
            f"\\label{{tab:{self.name}}}",
            f"\\begin{{tabular}}{{{spec}}}",
            "\\toprule",
            " & ".join(latex_escape(c) for c in cols) + " \\\\",
            "\\midrule",
        ]
        for row in self.frame.itertuples(index=False):
            out.append(" & ".join(latex_escape(v) for v in row) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}"]
        foot = "\n".join([*self.notes, self.footer]).strip()
        if foot:
            out.append("\\par\\smallskip{\\footnotesize " + latex_escape(foot).replace("\n", " \\\\\n") + "}")
        out.append("\\end{table}")
        return "\n".join(out) + "\n"

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        md, csv, tex = (out_dir / f"{self.name}.{ext}" for ext in ("md", "csv", "tex"))
        md.write_text(f"# {md_text(self.title)}\n\n{self.markdown()}\n")
        self.data.rename(columns=csv_cell).map(csv_cell).to_csv(csv, index=False)  # no cell a spreadsheet runs
        tex.write_text(self.latex())
        return [md, csv, tex]

    def terminal(self) -> str:
        """Markdown table, then notes and the one-line parameters as plain text."""
        footer = self.short_footer or self.footer
        tail = "\n".join([*(f"Note: {n}" for n in self.notes), footer])
        return f"\n== {self.title} ==\n{self.grid()}\n{tail}\n"


def _md_footer(text: str) -> str:
    return "\n".join(f"<sub>{line}</sub>  " for line in text.splitlines() if line.strip())


LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "`": "",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
}


def latex_escape(value: object) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(value))


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fmt_step(x: float) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.0f}"


def fmt_sci(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return "0" if x == 0 else f"{x:.2g}"


def _interval_cols(prefix: str, iv: Interval) -> dict:
    return {f"{prefix}": iv.point, f"{prefix}_lo": iv.lo, f"{prefix}_hi": iv.hi}


def _perturbations(exp: Experiment, label: str) -> str:
    """The explicit inference perturbations of a group's runs (tag ``perturbation``), e.g. ``router=1``."""
    if "perturbation" not in exp.runs:
        return ""
    vals = sorted(set(exp.runs.loc[exp.runs["label"] == label, "perturbation"].fillna("")) - {""})
    return ", ".join(vals)


def summary_table(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig) -> Table:
    """One row per group; the ``perturbation`` column (when runs carry the tag) names every explicit knob on."""
    rows, data = [], []
    perts = {label: _perturbations(exp, label) for label in exp.labels}
    show_pert = any(perts.values())
    show_cov = measures["coverage_mean"].notna().any() if "coverage_mean" in measures else False
    for label in exp.labels:
        g = measures[measures["label"] == label]
        seed = cfg.seed  # intervals are keyed by their data (stats.data_rng), not by the group's position
        fin = iqm_ci(g["final"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)
        peak = iqm_ci(g["peak"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)
        area = iqm_ci(g["auc"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)
        n = len(g)
        k_col = int(g["collapsed"].sum())
        k_dip = int((g["collapse_kind"] == "transient").sum())
        k_rob = int((g["collapsed"].astype(bool) & g["collapsed_h90"].astype(bool)).sum())  # holds at -10% of steps
        k_late = int(g["late"].astype(bool).sum())
        rate = wilson(k_col, n, cfg.ci)
        timed = g.dropna(subset=["collapse_time"])
        onset_med = km_median(timed["collapse_time"].to_numpy(float), timed["collapsed"].to_numpy(bool))
        cp = g["cp_onset"].dropna()
        cp_med = float(cp.median()) if len(cp) else math.nan
        conv = g.dropna(subset=["converge_time"])
        k_conv = int(g["converged"].sum())
        conv_med = km_median(conv["converge_time"].to_numpy(float), conv["converged"].to_numpy(bool))
        kl = iqm(g["kl_mean"].dropna().to_numpy(float))
        st = g["step_time"].dropna()
        step_time = float(st.mean()) if len(st) else math.nan
        cov = iqm(g["coverage_mean"].dropna().to_numpy(float)) if show_cov else math.nan
        rows.append({
            "group": label,
            **({"perturbation": perts[label] or "none"} if show_pert else {}),
            "runs": n,
            "final": fin.fmt(),
            "peak": peak.fmt(),
            "AUC": area.fmt(),
            "collapsed": f"{k_col}/{n}",
            "robust / late": f"{k_rob}/{k_late}" if k_col else "-",
            "transient dips": f"{k_dip}/{n}",
            "onset (KM median)": fmt_step(onset_med) if k_col else "-",
            "change point (median)": fmt_step(cp_med),
            "converged": f"{k_conv}/{n}",
            "conv. step (KM median)": fmt_step(conv_med),
            "k3 (IQM)": fmt_sci(kl),
            **({"replay coverage (IQM)": fmt(cov)} if show_cov else {}),
            "s/step": fmt(step_time, 2),
        })
        data.append({
            "group": label, "perturbation": perts[label], "runs": n, "seeds": int(g["seed"].nunique()),
            **_interval_cols("final_iqm", fin), **_interval_cols("peak_iqm", peak), **_interval_cols("auc_iqm", area),
            "collapsed": k_col, "collapsed_robust": k_rob, "collapsed_late": k_late,
            **_interval_cols("collapse_rate", rate), "transient": k_dip,
            "onset_km_median": onset_med, "cp_onset_median": cp_med,
            "converged": k_conv, "converge_km_median": conv_med,
            "target": float(g["target"].iloc[0]) if n else math.nan,
            "kl_iqm": kl, "step_time_mean": step_time, "replay_coverage_iqm": cov,
        })
    t = Table("summary", f"Summary per group (IQM across seeds [{cfg.ci:.0%} CI])", pd.DataFrame(rows),
              pd.DataFrame(data), cfg.describe(), short_footer=cfg.describe_short())
    if len(measures) and measures.groupby("label").size().max() < 2:
        t.notes.append("every group has a single seed: confidence intervals need >= 2 seeds per group.")
    t.notes.append("robust / late: collapses that still count with the last 10% of the steps cut / collapses whose "
                   "onset lies in the last 10% of the run (a different kind of evidence than a mid-run collapse).")
    target = float(measures["target"].iloc[0]) if len(measures) else math.nan
    t.notes.append(f"convergence target (best group IQM of the final reward) = {fmt(target)}.")
    return t


def marginal_table(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, tag: str) -> Table | None:
    """Pooled over the estimator groups, one row per value of a ``--group-by`` tag (e.g. each perturbation arm).

    Collapse rate with its Wilson interval over all runs of the arm; IQM of the final reward and of
    the AUC with a bootstrap CI stratified by group (every group keeps its seeds in each resample).
    """
    if tag not in exp.runs or len(measures) == 0:
        return None
    m = measures.merge(exp.runs[["run_id", tag]], on="run_id", how="left")
    values = list(dict.fromkeys(m[tag].fillna("")))
    if len(values) < 2:
        return None
    values.sort(key=lambda v: (v not in ("", "none", "na"), v))
    rows, data = [], []
    for v in values:
        g = m[m[tag].fillna("") == v]
        strata = [gg.to_numpy(float) for _, gg in g.groupby("label")["final"]]
        fin = iqm_ci(strata, cfg.bootstrap_reps, cfg.ci, cfg.seed)
        auc = iqm_ci([gg.to_numpy(float) for _, gg in g.groupby("label")["auc"]], cfg.bootstrap_reps, cfg.ci, cfg.seed)
        n, c = len(g), int(g["collapsed"].sum())
        rate = wilson(c, n, cfg.ci)
        kl = iqm(g["kl_mean"].dropna().to_numpy(float))
        rows.append({tag: v or "-", "groups": g["label"].nunique(), "runs": n, "collapsed": f"{c}/{n}",
                     "collapse rate": rate.fmt(2), "final": fin.fmt(), "AUC": auc.fmt(), "k3 (IQM)": fmt_sci(kl)})
        data.append({tag: v, "groups": g["label"].nunique(), "runs": n, "collapsed": c,
                     **_interval_cols("collapse_rate", rate), **_interval_cols("final_iqm", fin),
                     **_interval_cols("auc_iqm", auc), "kl_iqm": kl})
    t = Table(f"by_{folder_name(tag)}", f"Pooled over the groups, by {tag}", pd.DataFrame(rows), pd.DataFrame(data),
              cfg.describe(), short_footer=cfg.describe_short())
    t.notes.append(f"collapse rate: Wilson {cfg.ci:.0%} interval over all runs of the row; final, AUC: IQM with a "
                   "bootstrap CI stratified by group.")
    return t


def groups_table(exp: Experiment, cfg: AnalysisConfig) -> Table:
    """One row per group: its key (``group_sig``), runs, seeds, and the identity params that vary across
    the experiment's groups with this group's values: what sets it apart from the others."""
    g = exp.groups
    frame = pd.DataFrame({"group": g["label"], "group_sig": g["group_key"], "runs": g["runs"], "seeds": g["seeds"],
                          "what sets it apart": g["apart"]})
    t = Table("groups", "Groups and what sets each apart", frame, g.copy(), cfg.describe(),
              short_footer=cfg.describe_short())
    t.notes.append("a group is one spec up to the seed (the run tag group_sig, or for older runs a hash of the "
                   "logged params without seed, tracking, launcher and output keys); the last column lists the "
                   "params that take more than one value across the groups, with this group's values.")
    if len(exp.excluded):
        t.notes.append(f"{len(exp.excluded)} run(s) left out (not FINISHED, or superseded by a later run of the same "
                       "spec and seed): see the notes.")
    return t


def runs_table(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig) -> Table:
    m = measures.merge(exp.runs[["run_id", "status", "spec_sig"]], on="run_id", how="left")
    frame = pd.DataFrame({
        "group": m["label"], "seed": m["seed"], "run": m["run_id"].str[:8], "steps": m["n_steps"],
        "final": m["final"].map(fmt), "peak": m["peak"].map(fmt), "drop": m["drop"].map(fmt), "AUC": m["auc"].map(fmt),
        "margin": m["margin"].map(fmt), "kind": m["collapse_kind"],
        "onset": [fmt_step(o) + (" (nan)" if k == "nonfinite" else "") for o, k in zip(m["onset"], m["onset_kind"])],
        "first dip": m["dip_step"].map(fmt_step),
        "change point": m["cp_onset"].map(fmt_step), "converged at": m["converge_step"].map(fmt_step),
        "k3 mean": m["kl_mean"].map(fmt_sci),
    })
    return Table("runs", "Per-run measures", frame, m, cfg.describe(), short_footer=cfg.describe_short())


def poi_table(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, metric: str = "final") -> Table | None:
    labels = exp.labels
    if len(labels) < 2:
        return None
    vals = {lab: measures.loc[measures["label"] == lab, metric].to_numpy(float) for lab in labels}
    frame_rows, data_rows = [], []
    for a in labels:
        row = {"P(row > column)": a}
        for b in labels:
            if a == b:
                row[b] = "-"
                continue
            if min(np.isfinite(vals[a]).sum(), np.isfinite(vals[b]).sum()) < 2:
                row[b] = "n/a"  # one seed against one: P(A > B) is 0, 1/2 or 1, not an estimate
                data_rows.append({"a": a, "b": b, "metric": metric, "poi": math.nan, "poi_lo": math.nan,
                                  "poi_hi": math.nan})
                continue
            iv = probability_of_improvement(vals[a], vals[b], cfg.bootstrap_reps, cfg.ci, cfg.seed)
            row[b] = fmt(iv.point, 2)
            data_rows.append({"a": a, "b": b, "metric": metric, "poi": iv.point, "poi_lo": iv.lo, "poi_hi": iv.hi})
        frame_rows.append(row)
    t = Table("poi", f"Probability of improvement of the {metric} reward, P(row > column)",
              pd.DataFrame(frame_rows), pd.DataFrame(data_rows), cfg.describe(), short_footer=cfg.describe_short())
    t.notes.append("CIs per pair are in poi.csv and from `python -m analysis compare`; n/a: a group with fewer "
                   "than 2 seeds.")
    return t


def sweep_table(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, x: str) -> Table | None:
    fams = sweep_families(exp.runs, x, None)
    if not fams:
        return None
    m = measures.set_index("run_id")
    rows, data = [], []
    for g in fams.values():
        fam = family_name(g, x)
        for xv, gg in g.groupby(x):
            mm = m.loc[gg["run_id"]]
            rate = wilson(int(mm["collapsed"].sum()), len(mm), cfg.ci)
            fin = iqm_ci(mm["final"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, cfg.seed)
            rows.append({"family": fam, x: f"{xv:g}", "runs": len(mm), "collapsed": f"{int(mm['collapsed'].sum())}/{len(mm)}",
                         "collapse rate": rate.fmt(2), "final": fin.fmt()})
            data.append({"family": fam, x: xv, "runs": len(mm), "collapsed": int(mm["collapsed"].sum()),
                         **_interval_cols("collapse_rate", rate), **_interval_cols("final_iqm", fin)})
    return Table(f"sweep_{x}", f"Sweep over {x}", pd.DataFrame(rows), pd.DataFrame(data), cfg.describe(), short_footer=cfg.describe_short())


def noise_probe_table(exp: Experiment, cfg: AnalysisConfig) -> Table | None:
    """One row per (model, shape, perturbation) of the probe runs, beside KwaiKAT's row of the same kind.

    ``var_rollout / dense``: the MoE's var_rollout over the dense twin's (same perturbation, same depth);
    KwaiKAT's is 100.
    """
    p = exp.probes
    if p is None or p.empty:
        return None
    p = p.assign(layers=p["model_shape"].str.extract(r"^(L\d+)", expand=False).fillna(""))
    keys = ["perturbation", "layers", "model_kind", "model", "model_shape"]
    order = lambda k: (k[0] != "none", k[0], k[1], k[2] not in ("dense", "moe"), k[2] != "dense", k[3], k[4])  # noqa: E731
    groups = sorted(((k, g) for k, g in p.groupby(keys, dropna=False)), key=lambda kg: order(kg[0]))
    absent = [k for k in KWAIKAT_PROBE if k not in set(p["model_kind"])]
    means = {k: {m: float(g[m].mean()) if g[m].notna().any() else math.nan for m in PROBE_METRICS} for k, g in groups}
    rows, data = [], []
    for (pert, layers, kind, model, shape), g in groups + [(("", "", k, "", ""), p.iloc[:0]) for k in absent]:
        ref = KWAIKAT_PROBE.get(kind.lower(), {})
        ours = means.get((pert, layers, kind, model, shape), dict.fromkeys(PROBE_METRICS, math.nan))
        dense = [v for (pp, ll, kk, _, _), v in means.items() if (pp, ll, kk) == (pert, layers, "dense")]
        ratio = ours["probe/var_rollout"] / dense[0]["probe/var_rollout"] if kind == "moe" and dense else math.nan
        rows.append({
            "model": model or kind, "shape": shape or "-", "perturbation": pert or "-", "probe runs": len(g),
            **{f"{m.split('/')[1]} (ours)": fmt_sci(ours[m]) for m in PROBE_METRICS},
            "var_rollout / dense": fmt_sci(ratio),
            **{f"{m.split('/')[1]} (KwaiKAT)": fmt_sci(ref.get(m, math.nan)) for m in PROBE_METRICS},
        })
        data.append({"model_kind": kind, "model": model, "model_shape": shape, "perturbation": pert,
                     "probe_runs": len(g), **{f"{m}": ours[m] for m in PROBE_METRICS}, "var_rollout_over_dense": ratio,
                     **{f"kwaikat_{m}": ref.get(m, math.nan) for m in PROBE_METRICS}})
    t = Table("noise_probe", "Noise probe: MoE vs dense beside the KwaiKAT numbers", pd.DataFrame(rows),
              pd.DataFrame(data), cfg.describe(), short_footer=cfg.describe_short())
    t.notes.append("diff = mean |logp_train - logp_inf| per token; var_rollout / var_train = variance of the token "
                   "log-prob over repeated inference / training passes; ours = mean over probe runs of their latest value; "
                   "var_rollout / dense = the MoE's over its dense twin's at the same depth and perturbation "
                   "(KwaiKAT: 1e-3 / 1e-5 = 100).")
    return t
