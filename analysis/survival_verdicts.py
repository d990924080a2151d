"""``python -m analysis survival``: time-to-collapse verdicts for declared pairs of arms (science v4's positive control
and stage B; docs/preregistration_v4.md).

**Arms** are the experiment's groups (one spec up to the seed; the group label as the report names it). **Per run**
the endpoint of :func:`analysis.survival.endpoints` at the horizon H (detector v2 on the whole curve, the unscored
tail included: an event when a persistent collapse, or the first non-finite reward/loss, starts at or before H;
else censored at H).

**Per arm** (``arms.md``): runs, events by H, the share collapsed [Clopper-Pearson], the Kaplan-Meier median time to
collapse, the restricted mean survival time to H [interval] and the final reward's IQM.

**Per declared pair** ``A|B`` (``pairs.md``), over the seeds both arms ran (paired): the **seed-stratified log-rank**
test (the primary test of every v4 contrast: one chi2 on 1 df, each seed its own stratum), the Cox hazard ratio of B
vs A with seed strata [CI] (a profile interval when the likelihood is monotone, e.g. no event in one arm; never a
zero-width point), the paired RMST difference B - A [paired t interval], the exact McNemar test on collapse by H
(statsmodels), and the events of each arm. The pairs given are one family: **Holm** over their log-rank p values
(statsmodels ``multipletests``), "shown" when the Holm p < alpha. With no event in either arm there is nothing to
test: "no events" (never "shown", never a p of 1 that reads like evidence).

**The dose x estimator interaction** (``--interaction A|B``; stage B's B6): A and B name estimator arms (a group
label's part before ``[``, e.g. ``recompute`` and ``mean_n(n=8)``), each run at several doses (its logged
``inference.kl_target`` > 0). One test joins the family: Cox with seed strata on arm + log dose + arm x log dose
(:func:`analysis.survival.dose_interaction`), the interaction's p. Reported beside it (``dose.md``), not tested: each
arm's critical dose (the dose of 50% collapse by H, binomial GLM on log dose, Fieller interval) and their ratio
F = ED50_B / ED50_A with its parametric-bootstrap interval ("B moves the critical dose by a factor F").

Outputs in ``--out``: ``arms.{md,csv}``, ``pairs.{md,csv}`` (the family: pairs and the interaction), ``dose.md``
(with ``--interaction``), ``survival_runs.csv`` (the data: one row per run) and ``km.png`` (Kaplan-Meier curves per
arm). Nothing is logged to MLflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from .config import AnalysisConfig
from .histories import open_experiment
from .labels import estimator_part
from .load import AnalysisError, Experiment
from .measures import measure_experiment
from .paths import out_folder
from .stats import iqm
from .survival import (cox_hr, critical_dose, critical_dose_ratio, dose_interaction, endpoints, kaplan_meier,
                       logrank, paired_rmst_difference, rmst, share)

DOSE_PARAM = "inference.kl_target"
from .tables import Table


def parse_pair(text: str) -> tuple[str, str]:
    """``"A|B"`` -> (A, B); one line naming the option otherwise."""
    parts = [p.strip() for p in text.split("|")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise AnalysisError(f"--pair {text!r}: write two different group labels as \"A|B\", e.g. "
                            "\"recompute|mean_n(n=8)\"")
    return parts[0], parts[1]


def run_table(exp: Experiment, cfg: AnalysisConfig, horizon: float) -> pd.DataFrame:
    """One row per run: run_id, label, arm (the label's part before ``[``), seed, dose (its logged
    ``inference.kl_target``; 0 when none), time, event, last_step, final."""
    if len(exp.runs) == 0:
        raise AnalysisError(f"experiment {exp.name!r} holds no finished training run")
    m = endpoints(measure_experiment(exp, cfg), horizon)
    keys = dict(zip(exp.runs["run_id"], exp.runs["group_key"]))
    m["arm"] = [estimator_part(label) for label in m["label"]]
    m["dose"] = [_dose((exp.group_params.get(keys.get(rid), {}) or {}).get(DOSE_PARAM)) for rid in m["run_id"]]
    cols = ["run_id", "label", "arm", "seed", "dose", "time", "event", "last_step", "final"]
    return m[cols].sort_values(["label", "seed"], kind="stable").reset_index(drop=True)


def _dose(value) -> float:
    try:
        return float(value) if value not in (None, "", "None") else 0.0
    except (TypeError, ValueError):
        return math.nan


def arm_table(runs: pd.DataFrame, horizon: float, ci: float) -> pd.DataFrame:
    rows = []
    for label, g in runs.groupby("label", sort=True):
        ev = int(g["event"].sum())
        sh = share(ev, len(g), ci)
        km = kaplan_meier(g["time"], g["event"])
        rm = rmst(g["time"], g["event"], horizon, ci)
        rows.append({"arm": label, "runs": len(g), "events": ev, "share": sh.point, "share_lo": sh.lo,
                     "share_hi": sh.hi, "km_median": km.median, "rmst": rm.point, "rmst_lo": rm.lo,
                     "rmst_hi": rm.hi, "final_iqm": iqm(g["final"].to_numpy(float))})
    return pd.DataFrame(rows)


def _mcnemar(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Exact McNemar p on collapse by H over the common seeds (1 when no pair is discordant)."""
    from statsmodels.stats.contingency_tables import mcnemar

    ea = dict(zip(a["seed"], a["event"]))
    eb = dict(zip(b["seed"], b["event"]))
    common = sorted(set(ea) & set(eb))
    table = np.zeros((2, 2), int)
    for s in common:
        table[int(ea[s]), int(eb[s])] += 1
    return float(mcnemar(table, exact=True).pvalue)


def pair_table(runs: pd.DataFrame, pairs: list[tuple[str, str]], horizon: float, ci: float,
               alpha: float, dose: DoseVerdict | None = None) -> pd.DataFrame:
    from statsmodels.stats.multitest import multipletests

    labels = set(runs["label"])
    rows = []
    for a_label, b_label in pairs:
        missing = [x for x in (a_label, b_label) if x not in labels]
        if missing:
            raise AnalysisError(f"--pair {a_label}|{b_label}: no group {missing[0]!r}; the groups are: "
                                f"{', '.join(sorted(labels))}")
        a, b = runs[runs["label"] == a_label], runs[runs["label"] == b_label]
        seeds = sorted(set(a["seed"]) & set(b["seed"]))
        a, b = a[a["seed"].isin(seeds)], b[b["seed"].isin(seeds)]
        both = pd.concat([a.assign(arm=0), b.assign(arm=1)])
        lr = logrank(both["time"], both["event"], both["arm"], both["seed"])
        hr = cox_hr(both["time"], both["event"], both["arm"], both["seed"], ci)
        d = paired_rmst_difference(a, b, horizon, ci)
        rows.append({"A": a_label, "B": b_label, "seeds": len(seeds), "events_A": lr.events_a,
                     "events_B": lr.events_b, "logrank_chi2": lr.chi2, "logrank_p": lr.p, "hr": hr.point,
                     "hr_lo": hr.lo, "hr_hi": hr.hi, "hr_method": hr.method, "rmst_diff": d.diff.point,
                     "rmst_lo": d.diff.lo, "rmst_hi": d.diff.hi, "mcnemar_p": _mcnemar(a, b)})
    if dose is not None:  # the interaction: one more test of the family (its p in the log-rank column's place)
        i = dose.interaction
        rows.append({"A": f"{dose.a} x dose", "B": f"{dose.b} x dose", "seeds": dose.seeds, "events_A": math.nan,
                     "events_B": math.nan, "logrank_chi2": math.nan, "logrank_p": i.p, "hr": math.exp(i.coef)
                     if i.estimable else math.nan, "hr_lo": math.exp(i.lo) if i.estimable else math.nan,
                     "hr_hi": math.exp(i.hi) if i.estimable else math.nan,
                     "hr_method": "interaction" if i.estimable else "interaction (LR p)", "rmst_diff": math.nan,
                     "rmst_lo": math.nan, "rmst_hi": math.nan, "mcnemar_p": math.nan})
    out = pd.DataFrame(rows)
    p = out["logrank_p"].to_numpy(float)
    tested = np.isfinite(p)
    holm = np.full(len(p), math.nan)
    if tested.any():
        holm[tested] = multipletests(p[tested], alpha=alpha, method="holm")[1]
    out["holm_p"] = holm
    out["verdict"] = ["no events" if not np.isfinite(q) else ("**shown**" if q < alpha else "not shown")
                      for q in holm]
    return out


@dataclass
class DoseVerdict:
    a: str
    b: str
    interaction: object  # analysis.survival.Interaction
    ed50_a: object  # analysis.survival.CriticalDose
    ed50_b: object
    ratio: object  # analysis.survival.DoseRatio
    doses: list[float]
    seeds: int


def dose_verdict(runs: pd.DataFrame, pair: tuple[str, str], ci: float) -> DoseVerdict:
    """The interaction test and the critical doses of estimator arms A and B over their doses > 0."""
    a_arm, b_arm = pair
    arms = set(runs["arm"])
    for x in (a_arm, b_arm):
        if x not in arms:
            raise AnalysisError(f"--interaction {a_arm}|{b_arm}: no arm {x!r} (a label's part before '['); the arms "
                                f"are: {', '.join(sorted(arms))}")
    at = runs[runs["arm"].isin([a_arm, b_arm]) & (runs["dose"] > 0)]
    doses = sorted(set(at["dose"]))
    if len(doses) < 2:
        raise AnalysisError(f"--interaction {a_arm}|{b_arm}: needs runs of both arms at >= 2 doses > 0 "
                            f"(`{DOSE_PARAM}`), got {doses or 'none'}")
    seeds = sorted(set(at.loc[at["arm"] == a_arm, "seed"]) & set(at.loc[at["arm"] == b_arm, "seed"]))
    at = at[at["seed"].isin(seeds)]
    arm = (at["arm"] == b_arm).astype(int)
    inter = dose_interaction(at["time"], at["event"], arm, at["dose"], at["seed"], ci)
    a, b = at[arm == 0], at[arm == 1]
    ea, eb = critical_dose(a["dose"], a["event"], ci), critical_dose(b["dose"], b["event"], ci)
    return DoseVerdict(a_arm, b_arm, inter, ea, eb, critical_dose_ratio(ea, eb, ci), doses, len(seeds))


def dose_markdown(v: DoseVerdict, horizon: float, experiment: str) -> str:
    doses = ", ".join(f"{d:g}" for d in v.doses)
    return "\n".join([
        f"# Dose x estimator: {v.a} vs {v.b} in {experiment}", "",
        f"Doses (`{DOSE_PARAM}` > 0): {doses}; {v.seeds} seeds common to both arms; collapse by step {horizon:g}.", "",
        "| quantity | value |", "|---|---|",
        f"| interaction (Cox with seed strata: arm x log dose, the change of log HR({v.b} vs {v.a}) per unit log dose) "
        f"[95% CI], p | {v.interaction.fmt()} |",
        f"| critical dose of {v.a} (50% collapse by H; binomial GLM on log dose, Fieller) | {v.ed50_a.fmt()} |",
        f"| critical dose of {v.b} | {v.ed50_b.fmt()} |",
        f"| F = critical dose of {v.b} / of {v.a} (parametric bootstrap, 20000 draws, seed 0) | {v.ratio.fmt()} |",
        "", "The interaction's p is in the declared family (`pairs.md`, Holm); the critical doses and F are reported, "
        "not tested.", ""])


def _num(x: float, digits: int = 3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def _iv(point: float, lo: float, hi: float) -> str:
    if not np.isfinite(point):
        return "-"
    return f"{_num(point)} [{_num(lo)}, {_num(hi)}]"


def tables(arms: pd.DataFrame, pairs: pd.DataFrame, horizon: float, experiment: str,
           note: str) -> tuple[Table, Table]:
    a = Table("arms", f"Time to collapse per arm of {experiment}, censored at step {horizon:g}", pd.DataFrame({
        "arm": arms["arm"], "runs": arms["runs"], "collapsed by H": [f"{e}/{n}" for e, n in zip(arms["events"],
                                                                                               arms["runs"])],
        "share [95% CI]": [_iv(p, lo, hi) for p, lo, hi in zip(arms["share"], arms["share_lo"], arms["share_hi"])],
        "KM median": [_num(x, 4) for x in arms["km_median"]],
        "RMST to H [CI]": [_iv(p, lo, hi) for p, lo, hi in zip(arms["rmst"], arms["rmst_lo"], arms["rmst_hi"])],
        "final (IQM)": [_num(x) for x in arms["final_iqm"]]}), arms.copy(), footer=note)
    p = Table("pairs", f"Declared pairs of {experiment}: one family, Holm over the log-rank p values", pd.DataFrame({
        "A vs B": [f"{x} vs {y}" for x, y in zip(pairs["A"], pairs["B"])], "seeds (paired)": pairs["seeds"],
        "collapsed A / B": ["-" if pd.isna(x) else f"{int(x)} / {int(y)}" for x, y in zip(pairs["events_A"],
                                                                                        pairs["events_B"])],
        "log-rank p (seed strata)": [_num(x) for x in pairs["logrank_p"]],
        "Holm p": [_num(x) for x in pairs["holm_p"]],
        "HR B vs A [CI]": [_iv(h, lo, hi) + ("" if m == "wald" else f" ({m})")
                           for h, lo, hi, m in zip(pairs["hr"], pairs["hr_lo"], pairs["hr_hi"], pairs["hr_method"])],
        "RMST B - A [CI]": [_iv(x, lo, hi) for x, lo, hi in zip(pairs["rmst_diff"], pairs["rmst_lo"],
                                                                 pairs["rmst_hi"])],
        "McNemar p": [_num(x) for x in pairs["mcnemar_p"]], "verdict": pairs["verdict"]}), pairs.copy(),
              footer=note + "; log-rank stratified by seed (the decision), Cox HR with seed strata, RMST difference "
              "by the paired t interval, McNemar exact on collapse by H (beside, not tested for the decision)")
    return a, p


@dataclass
class SurvivalVerdicts:
    experiment: str
    horizon: float
    runs: pd.DataFrame
    arms: pd.DataFrame
    pairs: pd.DataFrame
    dose: DoseVerdict | None = None
    files: list[Path] = field(default_factory=list)


def _event_note(runs: pd.DataFrame, horizon: float) -> str:
    """What an event is, and the runs that stopped before H: censored at their last step when no event came first,
    events when one did (a run stopped on a non-finite loss or reward)."""
    stopped = runs["last_step"] < horizon
    censored, diverged = int((stopped & ~runs["event"]).sum()), int((stopped & runs["event"]).sum())
    return ("an event = a persistent collapse (detector v2 on the whole curve, tail included) or a non-finite "
            "reward/loss starting at or before H; else censored at H"
            + (f"; {censored} run(s) stopped before H without an event (censored at their last step)" if censored else "")
            + (f"; {diverged} run(s) stopped before H after their event (events)" if diverged else ""))


def build_survival(experiment: str | None, tracking_uri: str | None, out: str | Path | None, cfg: AnalysisConfig,
                   horizon: float, pairs: list[str], source: str | Path | None = None,
                   include_unfinished: bool = False, filter_string: str | None = None,
                   interaction: str | None = None, echo: Callable[[str], None] | None = print) -> SurvivalVerdicts:
    """Load, test, write (module docstring). Raises :class:`AnalysisError` (exit 2) before writing anything."""
    if not (math.isfinite(horizon) and horizon > 0):
        raise AnalysisError(f"--horizon must be a positive number of steps, got {horizon:g}")
    declared = [parse_pair(p) for p in pairs]
    across = parse_pair(interaction) if interaction else None
    if not declared and across is None:
        raise AnalysisError("--pair: declare at least one pair of groups to compare, e.g. --pair \"recompute|mean_n(n=8)\"")
    exp = open_experiment(experiment, tracking_uri, source, metrics=(cfg.reward_metric, cfg.loss_metric),
                          filter_string=filter_string, include_unfinished=include_unfinished)
    runs = run_table(exp, cfg, horizon)
    arms = arm_table(runs, horizon, cfg.ci)
    dose = dose_verdict(runs, across, cfg.ci) if across else None
    pair_rows = pair_table(runs, declared, horizon, cfg.ci, cfg.alpha, dose)
    result = SurvivalVerdicts(exp.name, horizon, runs, arms, pair_rows, dose=dose)
    note = f"horizon H = {horizon:g} steps; " + _event_note(runs, horizon)
    folder = out_folder(exp.name, out)
    folder.mkdir(parents=True, exist_ok=True)
    ta, tp = tables(arms, pair_rows, horizon, exp.name, note)
    result.files += ta.write(folder) + tp.write(folder)
    if dose is not None:
        (folder / "dose.md").write_text(dose_markdown(dose, horizon, exp.name))
        result.files.append(folder / "dose.md")
    runs.to_csv(folder / "survival_runs.csv", index=False)
    result.files.append(folder / "survival_runs.csv")
    from .hazard_figure import km_arms_figure

    result.files.append(km_arms_figure(runs, horizon, folder / "km.png", cfg.dpi))
    if echo is not None:
        echo(ta.terminal())
        echo(tp.terminal())
        if dose is not None:
            echo(dose_markdown(dose, horizon, exp.name))
        echo(f"wrote {len(result.files)} files to {folder}")
    return result
