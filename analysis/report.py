"""``python -m analysis report``: one experiment -> tables in the terminal, ``<out>/*.png|pdf``,
tables as ``.md``/``.csv``/``.tex``, and ``<out>/report.md`` embedding them.

Pipeline: :func:`analysis.load.load_experiment` -> :func:`analysis.measures.measure_experiment` ->
tables (:mod:`analysis.tables`) and figures (:mod:`analysis.figures`) -> ``report.md`` -> the whole
output folder logged as artifacts of a summary MLflow run in the same experiment, tagged
``analysis_summary=1`` (loaders skip it).

Nothing that is missing crashes the report: a figure or table whose inputs are absent (a metric never
logged, no mean_n runs at several n, no probe runs, one seed per group) is replaced by a note saying
what it needs.
"""
from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from harness import metrics as M

from .config import AnalysisConfig, ConfigError
from .along import ALONG, along_table
from .histories import open_experiment
from .load import SUMMARY_TAG, Experiment, load_experiment
from .escape import md_code, md_text
from .paths import out_folder
from harness.uri import redact
from .measures import measure_experiment
from .tables import Table, groups_table, marginal_table, noise_probe_table, poi_table, runs_table, summary_table, sweep_table
from .labels import axis_column, default_axes, knob_columns, tag_text
from .verdict_tables import run_verdicts, separation_table, verdicts_table

SWEEP_FIGURE = {"n": "n_sweep", "clip_c": "tis_sensitivity"}
FIGURE_TITLES = {
    "reward_vs_step": "Reward vs step",
    "kl_vs_step": "Train-inference KL vs step",
    "survival": "Survival: share of runs not yet collapsed",
    "collapse_onset": "Collapse onset per run",
    "n_sweep": "n-sweep",
    "tis_sensitivity": "TIS sensitivity to C",
    "forest": "Pair comparisons: differences with simultaneous intervals",
}


@dataclass
class ReportResult:
    experiment: str
    out_dir: Path
    report_md: Path
    figures: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    summary_run_id: str | None = None


def build_report(
    experiment: str | None,
    tracking_uri: str | None = None,
    out_dir: str | Path | None = None,
    cfg: AnalysisConfig | None = None,
    x: str | None = None,
    filter_string: str | None = None,
    group_by: Sequence[str] = (),
    log_to_mlflow: bool = True,
    echo: Callable[[str], None] | None = print,
    include_unfinished: bool = False,
    source: str | Path | None = None,
    primary: Sequence[tuple] = (),
) -> ReportResult:
    """Write the report of ``experiment``; see the module docstring. Raises ``AnalysisError``. ``source``: an
    exported histories file read instead of the store (:mod:`analysis.histories`; nothing is logged).
    ``x``: the sweep axis to feature, an estimator knob (``n``, ``clip_c``, ``estimator.<knob>``) or any spec key the
    runs differ in (``trainer.lr``, ``inference.kl_target``): its sweep table, figure and trend families.
    ``primary``: the primary contrasts, pairs of group labels ``(a, b)`` and trends ``("trend", family)``."""
    cfg = cfg or AnalysisConfig()
    metrics = (cfg.reward_metric, cfg.loss_metric, cfg.kl_metric, cfg.time_metric, M.MOE_REPLAY_COVERAGE, *ALONG)
    exp = open_experiment(experiment, tracking_uri, source, metrics=metrics, filter_string=filter_string,
                          group_by=group_by, include_unfinished=include_unfinished)
    x = resolve_axis(exp, x)  # a key no run has: exit 2 before any file is written
    log_to_mlflow = log_to_mlflow and source is None  # a file has no store to log to
    declared = declared_primary(exp) if not primary else None
    primary = list(primary) or [tuple(c) for c in (declared or {}).get("contrasts", [])]
    out = out_folder(exp.name, out_dir)  # under the project, name sanitised
    out.mkdir(parents=True, exist_ok=True)  # only once the experiment is there: a bad name leaves no folder
    result = ReportResult(exp.name, out, out / "report.md", notes=list(exp.notes))

    measures = measure_experiment(exp, cfg)
    result.notes += _data_notes(exp, measures, cfg, primary, declared, x)
    comparisons = _tables(exp, measures, cfg, result, group_by, primary, x)
    order = _figures(exp, measures, cfg, result, comparisons, x)

    result.report_md.write_text(render_markdown(exp, result, cfg, order, x))
    if echo:
        echo(terminal_text(exp, result))
    if log_to_mlflow:
        try:
            result.summary_run_id = log_summary_run(exp, result, cfg)
        except Exception as exc:  # noqa: BLE001 - the files are written; logging is a bonus
            msg = f"could not log the report as MLflow artifacts: {type(exc).__name__}: {exc}"
            result.notes.append(msg)
            print(f"analysis: warning: {msg}", file=sys.stderr)
            result.report_md.write_text(render_markdown(exp, result, cfg, order, x))
    return result


def resolve_axis(exp: Experiment, x: str | None) -> str | None:
    """The runs-frame column of ``--x`` (``estimator.n`` -> ``n``); :class:`ConfigError` when no run has the key or
    its values are not numbers, naming the keys the runs differ in."""
    if x is None:
        return None
    col = axis_column(x)
    runs = exp.runs
    values = sorted({str(v) for v in runs[col] if tag_text(v)}) if col in runs else []
    if values and pd.to_numeric(pd.Series(values), errors="coerce").isna().all():
        raise ConfigError(f"--x {x}: its values are not numbers ({', '.join(values)}): an axis is numeric; use "
                          f"--group-by {x} to split the groups by it")
    if col in knob_columns() or runs.empty or values:
        return col
    swept = [c for c in runs.columns if "." in c] + [k for k in knob_columns() if k in runs and runs[k].nunique() > 1]
    raise ConfigError(f"--x {x}: not a key the runs of {exp.name!r} differ in; they differ in: "
                      f"{', '.join(swept) or 'no spec key'} (an estimator knob, e.g. n, is always accepted)")


def _data_notes(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, primary: Sequence[tuple],
                declared: dict | None, x: str | None) -> list[str]:
    """The notes on the data itself: primary contrasts, probe-only experiments, single seeds, short runs."""
    notes = []
    if primary:
        notes.append(primary_note(exp, primary, declared, (x,) if x else ()))
    if exp.runs.empty:
        notes.append("the experiment holds only probe runs: there are no training curves to analyse.")
    elif exp.runs.groupby("label").size().max() < 2:
        notes.append("every group has a single seed: confidence intervals (bands, [lo, hi]) need >= 2 seeds "
                     "per group; point estimates are shown alone.")
    if len(measures) and measures["n_steps"].max() < cfg.collapse_persist + cfg.smooth_window:
        notes.append(f"the runs are short (at most {int(measures['n_steps'].max())} steps): the drop-from-peak "
                     f"rule needs {cfg.collapse_persist} steps below the line, so only non-finite losses can "
                     "count as collapses here.")
    return notes


def _tables(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, result: ReportResult,
            group_by: Sequence[str], primary: Sequence[tuple], x: str | None) -> list:
    """Build and write every table into ``result``; returns the verdicts (computed once: tables and forest)."""
    tables: dict[str, Table] = {}
    comparisons: list = []
    if len(measures):
        tables["summary"] = summary_table(exp, measures, cfg)
        tables["groups"] = groups_table(exp, cfg)
        tables["runs"] = runs_table(exp, measures, cfg)
        for tag in group_by:
            by = marginal_table(exp, measures, cfg, tag)
            if by is not None:
                tables[by.name] = by
        poi = poi_table(exp, measures, cfg)
        if poi is not None:
            tables["poi"] = poi
            comparisons = run_verdicts(exp, measures, cfg, primary, (x,) if x else ())
            tables["separation"] = separation_table(comparisons, cfg)
            tables["verdicts"] = verdicts_table(comparisons, cfg)
        else:
            result.skipped["poi"] = "probability of improvement and verdicts need >= 2 groups."
    else:
        result.skipped["summary"] = "no training runs."
    along = along_table(exp, cfg) if len(measures) else None
    if along is not None:
        tables["along"] = along
    for knob in dict.fromkeys((*default_axes(), *([x] if x else []))):
        t = sweep_table(exp, measures, cfg, knob) if len(measures) else None
        if t is not None:
            tables[t.name] = t
        elif x == knob:
            result.skipped[f"sweep_{knob}"] = f"`--x {knob}` asked for a sweep, but no estimator has runs at >= 2 values of `{knob}`."
    probe = noise_probe_table(exp, cfg)
    if probe is not None:
        tables["noise_probe"] = probe
    else:
        result.skipped["noise_probe"] = ("no probe runs (tag `probe=1` with metrics `probe/diff`, `probe/var_rollout`, "
                                         "`probe/var_train` and tag `model_kind`) in this experiment.")
    for t in tables.values():
        t.write(result.out_dir)
    result.tables = tables
    return comparisons


def _figures(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, result: ReportResult, comparisons: list,
             x: str | None) -> list[str]:
    """Draw every figure into ``result`` (the ``--x`` sweep first); returns the figures' order."""
    from .figures import FIGURES, FigureContext, MissingInput, draw, draw_sweep
    from .palette import Palette

    ctx = FigureContext(exp, measures, cfg, Palette.from_runs(exp.runs), result.out_dir, comparisons=comparisons)
    order = list(FIGURES)
    if x:  # the requested sweep first: its own figure, or the generic one of any other key
        if x in SWEEP_FIGURE:
            order.remove(SWEEP_FIGURE[x])
        order.insert(0, SWEEP_FIGURE.get(x, "sweep"))
    for name in order:
        if exp.runs.empty:
            result.skipped[name] = "no training runs."
            continue
        try:
            result.figures[name] = draw_sweep(ctx, x) if name == "sweep" else draw(name, ctx)
        except MissingInput as why:
            result.skipped[name] = str(why)
    return order


def declared_primary(exp: Experiment) -> dict | None:
    """The primary contrasts a sweep declared for this experiment (tag ``primary_contrasts``: the store's, or the
    histories file's copy), or None."""
    import json

    from .load import client_for

    if exp.tags is not None:  # read from a histories file: its copy of the experiment's tags
        tag = exp.tags.get(M.EXPERIMENT_TAGS["primary"])
        return json.loads(tag) if tag else None
    try:
        tag = client_for(exp.tracking_uri).get_experiment(exp.experiment_id).tags.get(M.EXPERIMENT_TAGS["primary"])
    except Exception:  # noqa: BLE001 - a store without the experiment's tags: nothing declared
        return None
    return json.loads(tag) if tag else None


def primary_note(exp: Experiment, primary: Sequence[tuple], declared: dict | None, axes: Sequence[str] = ()) -> str:
    """What the primary contrasts are and whether they were declared before the experiment's first run."""
    import datetime as dt

    from .verdict_tables import ordered_families

    names = "; ".join(f"{c[0]} vs {c[1]}" if c[0] != "trend" else f"trend {c[1]}" for c in primary)
    unknown = sorted({x for c in primary if c[0] != "trend" for x in c} - set(exp.labels))
    if unknown:
        names += f" [no group {', '.join(map(repr, unknown))} in this experiment: that contrast is not tested]"
    trends = {c[1] for c in primary if c[0] == "trend"}
    families = set(ordered_families(exp, axes)) if trends and len(exp.runs) else set()
    if trends - families:  # a trend names an ordered family (``family_name`` over x): none of that name, no test
        have = ", ".join(sorted(families)) or "none"
        names += (f" [no ordered family {', '.join(map(repr, sorted(trends - families)))} in this experiment "
                  f"(families: {have}): that trend is not tested]")
    if declared is None:
        return f"primary contrasts given to the report ({names}): tested first, Holm among themselves; not " \
               "pre-registered (no declaration recorded before the runs)."
    at = declared["declared_at_ms"]
    first = int(exp.runs["start_time"].min()) if len(exp.runs) and exp.runs["start_time"].notna().any() else None
    when = dt.datetime.fromtimestamp(at / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if first is not None and at <= first:
        return f"primary contrasts ({names}) declared by the sweep at {when}, before the first run started: " \
               "pre-registered; tested first, Holm among themselves, everything else exploratory."
    return f"primary contrasts ({names}) declared by the sweep at {when}, after runs of this experiment had " \
           "started: labelled primary, not pre-registered."


def _overview(exp: Experiment) -> list[str]:
    runs = exp.runs
    lines = [f"- tracking URI: {md_code(redact(exp.tracking_uri))}, experiment {md_code(exp.name)} "
             f"(id {md_text(exp.experiment_id)})",
             f"- generated: {_dt.datetime.now().isoformat(timespec='seconds')}"]
    if len(runs):
        per = runs.groupby("label", sort=False).size()
        lines.append(f"- {len(runs)} training runs in {len(per)} groups; seeds per group: "
                     + ", ".join(f"{md_text(lab)} {k}" for lab, k in per.items()))
        commits = sorted(set(runs["git_commit"]) - {""})
        if commits:
            lines.append(f"- git commits: {', '.join(md_code(c[:12]) for c in commits[:5])}"
                         + (f" (+{len(commits) - 5} more)" if len(commits) > 5 else ""))
        for col in ("model", "task", "backend", "perturbation"):
            vals = sorted(set(runs[col]) - {""})
            if vals:
                lines.append(f"- {col}: {md_text(', '.join(vals))}")
    if exp.probes is not None and len(exp.probes):
        lines.append(f"- {len(exp.probes)} noise-probe runs")
    return lines


def render_markdown(exp: Experiment, result: ReportResult, cfg: AnalysisConfig, order: list[str], x: str | None) -> str:
    md = [f"# Analysis report: {md_code(exp.name)}", "", *_overview(exp), ""]
    notes = list(result.notes)
    if notes:
        md += ["## Notes", "", *[f"- {md_text(n)}" for n in notes], ""]
    md += ["## Definitions and parameters", "", *[f"{line}  " for line in cfg.describe().splitlines()], ""]
    t = result.tables
    md += ["## Summary", ""]
    md += [t["summary"].markdown(short=True), ""] if "summary" in t else [f"> Not available: {result.skipped.get('summary')}", ""]
    md += ["Files: `summary.md`, `summary.csv`, `summary.tex`; per run: `runs.md`, `runs.csv`, `runs.tex`.", ""]
    if "groups" in t:
        md += ["## Groups: what sets each apart", "", t["groups"].markdown(short=True), ""]
    for name in [n for n in t if n.startswith("by_")]:
        md += [f"## {md_text(t[name].title)}", "", t[name].markdown(short=True), "", f"Files: {md_code(name + '.md|csv|tex')}.", ""]

    from .figures import FIGURES, SWEEP_CAPTION

    md += ["## Figures", ""]
    for name in order:
        md += [f"### {FIGURE_TITLES.get(name, f'Sweep over {x}')}", ""]
        if name in result.figures:
            caption = FIGURES[name][1] if name in FIGURES else SWEEP_CAPTION
            md += [f"![{name}]({name}.png)", "", f"{caption} ([PDF]({name}.pdf))", ""]
        else:
            md += [f"> **Not drawn**: {result.skipped.get(name, 'inputs missing')}", ""]
        if name == "n_sweep" and "sweep_n" in t:
            md += [t["sweep_n"].markdown(with_title=True, short=True), ""]
        if name == "tis_sensitivity" and "sweep_clip_c" in t:
            md += [t["sweep_clip_c"].markdown(with_title=True, short=True), ""]
        if name == "sweep" and f"sweep_{x}" in t:
            md += [t[f"sweep_{x}"].markdown(with_title=True, short=True), ""]
        if name == SWEEP_FIGURE.get(x or "", "sweep") and f"sweep_{x}" in result.skipped:
            md += [f"> {result.skipped[f'sweep_{x}']}", ""]

    if "along" in t:
        md += [f"## {t['along'].title}", "", t["along"].markdown(short=True), "", "Files: `along.md|csv|tex`.", ""]
    md += ["## Noise probe", ""]
    md += [t["noise_probe"].markdown(short=True), ""] if "noise_probe" in t else [f"> **Not available**: {result.skipped['noise_probe']}", ""]
    md += ["## Probability of improvement", ""]
    md += [t["poi"].markdown(short=True), ""] if "poi" in t else [f"> **Not available**: {result.skipped.get('poi', 'no runs')}", ""]
    if "separation" in t:
        md += ["## Verdicts: comparisons that separate", "", t["separation"].markdown(short=True), "",
               "Every comparison (test, seeds, effect, p, Holm p, BH q, verdict): `verdicts.md|csv|tex`; these: "
               "`separation.md|csv|tex`.", ""]
    md += ["## Per-run measures", ""]
    if "runs" in t:
        md += [t["runs"].markdown(short=True) if len(t["runs"].frame) <= 60 else
               f"{len(t['runs'].frame)} runs: see `runs.md` / `runs.csv`.", ""]
    if result.summary_run_id:
        md += [f"Logged as artifacts of MLflow run `{result.summary_run_id}` (tag `{SUMMARY_TAG}=1`).", ""]
    return "\n".join(md)


def terminal_text(exp: Experiment, result: ReportResult) -> str:
    parts = [f"# {exp.name}: {len(exp.runs)} training runs, {exp.runs['label'].nunique() if len(exp.runs) else 0} groups"]
    parts += [f"note: {n}" for n in result.notes]
    for name in ("summary", "groups", *[n for n in result.tables if n.startswith(("by_", "sweep_"))],
                 "noise_probe", "poi", "separation"):
        if name in result.tables:
            parts.append(result.tables[name].terminal())
    for name, why in result.skipped.items():
        parts.append(f"not drawn / not available: {name}: {why}")
    parts.append(f"\nreport: {result.report_md}  ({len(result.figures)} figures, PNG + PDF, in {result.out_dir})")
    return "\n".join(parts)


def log_summary_run(exp: Experiment, result: ReportResult, cfg: AnalysisConfig) -> str:
    """Log the output folder as artifacts of a new run tagged ``analysis_summary=1``; returns its id."""
    from mlflow.entities import Param

    from .load import client_for

    client = client_for(exp.tracking_uri)
    run = client.create_run(exp.experiment_id, run_name="analysis-summary", tags={
        SUMMARY_TAG: "1",
        "mlflow.note.content": f"Analysis report of {exp.name}: {len(exp.runs)} runs, {len(result.figures)} figures.",
    })
    run_id = run.info.run_id
    try:
        params = [Param(f"analysis.{k}", str(v)) for k, v in cfg.as_dict().items()]
        client.log_batch(run_id, params=params)
        result.report_md.write_text(result.report_md.read_text().rstrip() + "\n\n"
                                    f"Logged as artifacts of MLflow run `{run_id}` (tag `{SUMMARY_TAG}=1`).\n")
        client.log_artifacts(run_id, str(result.out_dir))
        client.set_terminated(run_id)
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    return run_id


def measures_frame(experiment: str, tracking_uri: str | None = None, cfg: AnalysisConfig | None = None) -> pd.DataFrame:
    """The per-run measures of an experiment, for notebooks."""
    cfg = cfg or AnalysisConfig()
    return measure_experiment(load_experiment(experiment, tracking_uri), cfg)
