"""``python -m analysis hazard``: stage A's hazard map (docs/preregistration_v4.md) and its selection rule.

**Cells**: the distinct (dose, lr) among the runs, read from each run's logged params: dose =
``inference.kl_target`` (the train-inference k3 the KL controller holds; 0 = the natural engine, the no-noise
control), lr = ``trainer.lr``. A run that logged neither is refused (exit 2): it has no place on the map. The
experiment must hold one estimator configuration and one spec per cell (a map varies only the dose and the lr).

**Per run** (:func:`run_table`): the endpoint of :func:`analysis.survival.endpoints` at horizon H (detector v2 on
the whole curve, tail included: an event when the persistent collapse or the first non-finite reward/loss has
its onset at or before H, else censored at H), the final reward (:func:`analysis.measures.measure_run`), and the
achieved dose = the run's mean of ``mismatch/rec_k3`` over its logged steps (finite values).

**Per cell** (:func:`cell_table`): the dose target, the achieved dose (median over seeds of the run means), lr,
runs, events by H, share = events / runs with its Clopper-Pearson 95 % interval, the Kaplan-Meier median time to
collapse ("-" when the curve stays above 0.5), the IQM of the final reward.

**The rule** (:func:`select_cell`), verbatim from the pre-registration (:data:`RULE_TEXT`): among the cells of
dose > 0 whose share lies in [0.3, 0.7] and whose no-noise control at the same lr has share <= 0.15, the
smallest dose; at that dose the lr whose share is nearest 0.5; a tie to the smaller lr. The comparisons are
exact (fractions k/n, no floating-point edge). If no cell qualifies: "no cell qualifies", and the smallest dose
at which recompute's share exceeds the control's at the same lr, for some lr (the dose at which collapse starts),
or that no dose does.

Outputs in ``--out``: ``map.md``/``map.csv``/``map.tex`` (:class:`analysis.tables.Table`), ``rule.md``,
``hazard_runs.csv`` (one row per run: the data behind the map), ``map.png`` and ``km.png``
(:mod:`analysis.hazard_figure`). Nothing is logged to MLflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from harness import metrics as M

from .config import AnalysisConfig
from .histories import open_experiment
from .load import AnalysisError, Experiment, require_one_estimator
from .measures import first_nonfinite_step, measure_experiment
from .paths import out_folder
from .stats import iqm
from .survival import kaplan_meier, share
from .tables import Table, fmt_step

DOSE_PARAM = "inference.kl_target"
LR_PARAM = "trainer.lr"
ACHIEVED_METRIC = M.MISMATCH_REC_K3
SHARE_RANGE = (Fraction(3, 10), Fraction(7, 10))  # a qualifying cell's collapse share, inclusive
CONTROL_MAX = Fraction(15, 100)  # the no-noise control's share at the same lr, at most
#: the selection rule as docs/preregistration_v4.md words it (tests/analysis/test_hazard.py checks it is there)
RULE_TEXT = (
    "among the cells whose recompute collapse share by step 1500 lies in\n  [0.3, 0.7] (3, 4 or 5 of 8) **and** "
    "whose no-noise control at the same lr collapses <= 0.15 (0 or 1 of 8): the\n  smallest dose; at that dose, "
    "the lr whose share is nearest 0.5; a tie goes to the smaller lr. Dose 0 cells cannot\n  qualify (they are the "
    "control). **If no cell qualifies, that is the finding**: the README then states the smallest\n  dose at which "
    "recompute's collapse share exceeds the control's at any lr (the dose at which collapse starts)"
)


def _number(value: object, key: str, where: str) -> float:
    try:
        x = float(str(value).strip())
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise AnalysisError(f"{where}: param `{key}` is {value!r}, not a number >= 0: a hazard map reads its cells "
                            f"from the runs' logged `{DOSE_PARAM}` and `{LR_PARAM}` (run the sweep with the harness, "
                            "which logs the spec)")
    return x


def _check_one_spec_per_cell(exp: Experiment, runs: pd.DataFrame) -> None:
    require_one_estimator(exp.name, exp.runs["label"], "a hazard map")
    keys = runs.groupby(["dose", "lr"])["group_key"].nunique()
    mixed = keys[keys > 1]
    if len(mixed):
        dose, lr = mixed.index[0]
        labels = sorted(set(runs.loc[(runs["dose"] == dose) & (runs["lr"] == lr), "label"]))
        raise AnalysisError(f"cell dose {dose:g}, lr {lr:g} holds runs of {mixed.iloc[0]} specs ({', '.join(labels)}): "
                            "they differ in more than the dose and the lr; narrow the runs with --filter")


def run_table(exp: Experiment, cfg: AnalysisConfig, horizon: float) -> pd.DataFrame:
    """One row per run: run_id, label, seed, dose, lr, time, event, tail, last_step, final, achieved."""
    from .survival import endpoints

    if len(exp.runs) == 0:
        raise AnalysisError(f"experiment {exp.name!r} holds no finished training run to map")
    for key in (DOSE_PARAM, LR_PARAM):
        if key not in exp.runs:  # the loader adds a column per --group-by key
            raise AnalysisError(f"experiment {exp.name!r}: runs loaded without their `{key}` (load with group_by)")
    m = endpoints(measure_experiment(exp, cfg), horizon).set_index("run_id")
    rows = []
    for _, run in exp.runs.iterrows():
        rid = run["run_id"]
        where = f"run {rid[:8]} ({run['label']} seed {run['seed']})"
        k3 = exp.series(ACHIEVED_METRIC, rid).to_numpy(dtype=float)
        k3 = k3[np.isfinite(k3)]
        rows.append({"run_id": rid, "label": run["label"], "group_key": run["group_key"], "seed": int(run["seed"]),
                     "dose": _number(run[DOSE_PARAM] or None, DOSE_PARAM, where),
                     "lr": _number(run[LR_PARAM] or None, LR_PARAM, where),
                     "time": float(m.at[rid, "time"]), "event": bool(m.at[rid, "event"]),
                     "tail": float(m.at[rid, "tail"]), "last_step": float(m.at[rid, "last_step"]),
                     "final": float(m.at[rid, "final"]), "achieved": float(k3.mean()) if len(k3) else math.nan})
    runs = pd.DataFrame(rows).sort_values(["dose", "lr", "seed"], kind="stable").reset_index(drop=True)
    _check_one_spec_per_cell(exp, runs)
    return runs


CELL_COLUMNS = ("dose", "achieved", "lr", "runs", "events", "share", "share_lo", "share_hi", "km_median",
                "final_iqm", "censored_early")


def cell_table(runs: pd.DataFrame, horizon: float, ci: float = 0.95) -> pd.DataFrame:
    """One row per (dose, lr), sorted by dose then lr (module docstring)."""
    rows = []
    for (dose, lr), g in runs.groupby(["dose", "lr"], sort=True):
        k, n = int(g["event"].sum()), len(g)
        sh = share(k, n, ci)
        ach = g["achieved"].dropna()
        rows.append({"dose": dose, "achieved": float(ach.median()) if len(ach) else math.nan, "lr": lr, "runs": n,
                     "events": k, "share": sh.point, "share_lo": sh.lo, "share_hi": sh.hi,
                     "km_median": kaplan_meier(g["time"], g["event"]).median,
                     "final_iqm": iqm(g["final"].dropna().to_numpy()),
                     "censored_early": int(((~g["event"]) & (g["time"] < horizon)).sum())})
    return pd.DataFrame(rows, columns=list(CELL_COLUMNS))


@dataclass(frozen=True)
class Rule:
    """What the rule says: ``chosen`` (dose, lr) or None; when None, ``onset`` (dose, [lrs]) or None."""

    chosen: tuple[float, float] | None
    verdicts: pd.DataFrame  # per cell of dose > 0: dose, lr, k, n, control k, control n, in_range, control_ok, qualifies
    onset: tuple[float, list[float]] | None = None
    ties: list[float] = field(default_factory=list)  # lrs tied for nearest 0.5 at the chosen dose (the first won)


def _frac(k: int, n: int) -> Fraction:
    return Fraction(int(k), int(n))


def select_cell(cells: pd.DataFrame) -> Rule:
    """The pre-registered rule on a :func:`cell_table` (module docstring)."""
    control = {lr: (int(r.events), int(r.runs)) for r in cells.itertuples() if r.dose == 0 for lr in [r.lr]}
    rows = []
    for r in cells.itertuples():
        if r.dose <= 0 or r.runs == 0:
            continue
        s = _frac(r.events, r.runs)
        ck, cn = control.get(r.lr, (None, None))
        in_range = SHARE_RANGE[0] <= s <= SHARE_RANGE[1]
        control_ok = cn is not None and cn > 0 and _frac(ck, cn) <= CONTROL_MAX
        rows.append({"dose": r.dose, "lr": r.lr, "events": int(r.events), "runs": int(r.runs),
                     "control_events": ck, "control_runs": cn, "in_range": in_range, "control_ok": control_ok,
                     "qualifies": in_range and control_ok,
                     "exceeds_control": cn is not None and cn > 0 and s > _frac(ck, cn)})
    verdicts = pd.DataFrame(rows, columns=["dose", "lr", "events", "runs", "control_events", "control_runs",
                                           "in_range", "control_ok", "qualifies", "exceeds_control"])
    ok = verdicts[verdicts["qualifies"]]
    if len(ok):
        dose = ok["dose"].min()
        at = ok[ok["dose"] == dose]
        dist = {lr: abs(_frac(k, n) - Fraction(1, 2)) for lr, k, n in zip(at["lr"], at["events"], at["runs"])}
        best = min(dist.values())
        tied = sorted(lr for lr, d in dist.items() if d == best)
        return Rule((float(dose), float(tied[0])), verdicts, None, tied if len(tied) > 1 else [])
    exceeds = verdicts[verdicts["exceeds_control"]]
    if len(exceeds):
        dose = exceeds["dose"].min()
        return Rule(None, verdicts, (float(dose), sorted(exceeds.loc[exceeds["dose"] == dose, "lr"].tolist())))
    return Rule(None, verdicts)


def dose_text(dose: float) -> str:
    return "0 (no noise)" if dose == 0 else f"{dose:g}"


def _k_of_n(k, n) -> str:
    return "-" if k is None or n is None or (isinstance(n, float) and math.isnan(n)) else f"{int(k)}/{int(n)}"


def map_table(cells: pd.DataFrame, horizon: float, experiment: str, notes: list[str]) -> Table:
    frame = pd.DataFrame({
        "dose (k3 target)": [dose_text(d) for d in cells["dose"]],
        "achieved k3": [f"{a:.2g}" if np.isfinite(a) else "-" for a in cells["achieved"]],
        "lr": [f"{x:g}" for x in cells["lr"]],
        "runs": cells["runs"].astype(int).astype(str),
        f"events by {horizon:g}": cells["events"].astype(int).astype(str),
        "share [95% CP]": [f"{p:.2f} [{lo:.2f}, {hi:.2f}]" for p, lo, hi in
                           zip(cells["share"], cells["share_lo"], cells["share_hi"])],
        "KM median": [fmt_step(x) for x in cells["km_median"]],
        "final IQM": [f"{x:.3f}" if np.isfinite(x) else "-" for x in cells["final_iqm"]],
    })
    footer = (f"Experiment `{experiment}`; horizon H = {horizon:g} steps. Event: a persistent collapse (detector v2 on "
              "the whole curve, unscored tail included) or a non-finite reward/loss with onset <= H; otherwise censored "
              f"at H. Share: events / runs, exact Clopper-Pearson 95% interval. KM median: first step with S <= 0.5 "
              f"('-': never). Achieved k3: median over seeds of the run mean of `{ACHIEVED_METRIC}`. Final IQM: IQM over "
              "seeds of the mean reward of each run's last steps.")
    return Table("map", f"Hazard map of {experiment}: collapse by step {horizon:g}, per dose and lr", frame,
                 cells.copy(), footer=footer, notes=list(notes), short_footer=f"H = {horizon:g}; docs/analysis.md")


def rule_markdown(rule: Rule, cells: pd.DataFrame, horizon: float, experiment: str, notes: list[str]) -> str:
    lines = [f"# Stage A selection rule: {experiment}", "",
             f"Horizon H = {horizon:g} steps; {int(cells['runs'].sum())} runs in {len(cells)} cells "
             f"({', '.join(sorted({str(int(n)) for n in cells['runs']}))} runs a cell).", "",
             "The rule (docs/preregistration_v4.md, stage A), verbatim:", "",
             "> " + " ".join(RULE_TEXT.split()), "",
             "| dose | lr | recompute | control at lr | share in [0.3, 0.7] | control <= 0.15 | qualifies |",
             "|---|---:|---:|---:|---|---|---|"]
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    for v in rule.verdicts.itertuples():
        lines.append(f"| {dose_text(v.dose)} | {v.lr:g} | {v.events}/{v.runs} | "
                     f"{_k_of_n(v.control_events, v.control_runs)} | {yes(v.in_range)} | {yes(v.control_ok)} | "
                     f"{'**yes**' if v.qualifies else 'no'} |")
    lines.append("")
    if rule.chosen is not None:
        dose, lr = rule.chosen
        v = rule.verdicts[(rule.verdicts["dose"] == dose) & (rule.verdicts["lr"] == lr)].iloc[0]
        lines.append(f"**Chosen cell: dose {dose_text(dose)} at lr {lr:g}** (recompute {v.events}/{v.runs} collapsed by "
                     f"step {horizon:g}; the no-noise control at lr {lr:g}: {_k_of_n(v.control_events, v.control_runs)}).")
        if rule.ties:
            lines.append(f"At dose {dose_text(dose)} the lrs {', '.join(f'{x:g}' for x in rule.ties)} are equally near "
                         f"0.5: the tie goes to the smaller lr, {lr:g}.")
    else:
        lines.append("**No cell qualifies.**")
        if rule.onset is not None:
            dose, lrs = rule.onset
            at = rule.verdicts[(rule.verdicts["dose"] == dose) & rule.verdicts["exceeds_control"]]
            detail = "; ".join(f"lr {v.lr:g}: {v.events}/{v.runs} vs the control's "
                               f"{_k_of_n(v.control_events, v.control_runs)}" for v in at.itertuples())
            lines.append(f"The smallest dose at which recompute's collapse share exceeds the control's at the same lr: "
                         f"**{dose_text(dose)}** ({detail}).")
        else:
            lines.append("At no dose does recompute's collapse share exceed the no-noise control's at the same lr.")
    if notes:
        lines += ["", *(f"Note: {n}" for n in notes)]
    return "\n".join(lines) + "\n"


@dataclass
class HazardMap:
    experiment: str
    horizon: float
    runs: pd.DataFrame
    cells: pd.DataFrame
    rule: Rule
    notes: list[str]
    files: list[Path] = field(default_factory=list)


def _stopped_nonfinite(exp: Experiment, run_id: str, cfg: AnalysisConfig) -> tuple[float, str]:
    """(step, "loss" or "reward") of a run's first non-finite logged value, or (NaN, "") when it has none."""
    found = []
    for what, metric in (("loss", cfg.loss_metric), ("reward", cfg.reward_metric)):
        series = exp.series(metric, run_id)
        step = first_nonfinite_step(series.index.to_numpy(), series.to_numpy(dtype=float))  # NaN when empty
        if not math.isnan(step):
            found.append((step, what))
    return min(found) if found else (math.nan, "")


def _notes(exp: Experiment, runs: pd.DataFrame, cells: pd.DataFrame, horizon: float,
           cfg: AnalysisConfig) -> list[str]:
    notes = list(exp.notes)
    no_tail = runs[runs["last_step"] <= horizon]
    stopped = {rid: _stopped_nonfinite(exp, rid, cfg) for rid in no_tail["run_id"]}
    diverged = [f"{rid[:8]} (a non-finite {what} at step {step:g})" for rid, (step, what) in stopped.items()
                if what]
    if diverged:
        notes.append(f"{len(diverged)} run(s) stopped before H = {horizon:g} on a non-finite value (diverged: an event "
                     f"by step {horizon:g} whatever their curve): {', '.join(diverged)}.")
    short = [rid[:8] for rid, (_, what) in stopped.items() if not what]
    if short:
        notes.append(f"{len(short)} run(s) end at or before H = {horizon:g} (no unscored tail: a dip open at their "
                     f"last step counts as a collapse): {', '.join(short)}.")
    early = int(cells["censored_early"].sum())
    if early:
        notes.append(f"{early} run(s) stopped before H without a collapse: censored at their last step, counted in "
                     "the runs of their cell (the share events / runs understates the KM estimate there).")
    if cells["runs"].nunique() > 1:
        notes.append(f"cells hold different numbers of runs ({cells['runs'].min()}..{cells['runs'].max()}): the "
                     "pre-registered map is read once every cell has all its seeds.")
    missing = runs["achieved"].isna().sum()
    if missing:
        notes.append(f"{missing} run(s) did not log `{ACHIEVED_METRIC}`: left out of the achieved dose.")
    lrs = set(cells["lr"])
    no_control = sorted(lrs - set(cells.loc[cells["dose"] == 0, "lr"]))
    if no_control:
        notes.append(f"no no-noise control (dose 0) at lr {', '.join(f'{x:g}' for x in no_control)}: no cell there "
                     "can qualify.")
    return notes


def build_hazard(experiment: str | None, tracking_uri: str | None, out: str | Path | None, cfg: AnalysisConfig,
                 horizon: float, source: str | Path | None = None, include_unfinished: bool = False,
                 filter_string: str | None = None, echo: Callable[[str], None] | None = print) -> HazardMap:
    """Load, map, apply the rule, write the files (module docstring). Raises :class:`AnalysisError`."""
    if not (math.isfinite(horizon) and horizon > 0):
        raise AnalysisError(f"--horizon must be a positive number of steps, got {horizon:g}")
    exp = open_experiment(experiment, tracking_uri, source,
                          metrics=(cfg.reward_metric, cfg.loss_metric, ACHIEVED_METRIC),
                          filter_string=filter_string, group_by=(DOSE_PARAM, LR_PARAM),
                          include_unfinished=include_unfinished)
    runs = run_table(exp, cfg, horizon)
    cells = cell_table(runs, horizon, cfg.ci)
    rule = select_cell(cells)
    notes = _notes(exp, runs, cells, horizon, cfg)
    result = HazardMap(exp.name, horizon, runs, cells, rule, notes)
    folder = out_folder(exp.name, out)
    folder.mkdir(parents=True, exist_ok=True)
    table = map_table(cells, horizon, exp.name, notes)
    result.files += table.write(folder)
    (folder / "rule.md").write_text(rule_markdown(rule, cells, horizon, exp.name, notes))
    runs.drop(columns=["group_key"]).to_csv(folder / "hazard_runs.csv", index=False)
    result.files += [folder / "rule.md", folder / "hazard_runs.csv"]
    from .hazard_figure import km_figure, map_figure

    result.files += [map_figure(cells, rule, horizon, folder / "map.png", cfg.dpi),
                     km_figure(runs, horizon, folder / "km.png", cfg.dpi)]
    if echo is not None:
        echo(table.terminal())
        echo(rule_markdown(rule, cells, horizon, exp.name, []).split("\n\n")[-1].strip())
        echo(f"wrote {len(result.files)} files to {folder}")
    return result
