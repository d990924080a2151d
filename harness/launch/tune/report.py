"""A tune study's report: the trials table, the best value, and the optimisation-history and slice plots."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from harness.launch.cli import format_table
from harness.launch.spec import SweepSpec
from harness.launch.tune.objective import Objective
from harness.launch.tune.spec import ParamSpec, TuneConfig, parse_tune, store_of
from harness.launch.tune.study import open_study, quiet_optuna
from harness.launch.tune.trial import short
from harness.uri import redact


def trials_table(study, tc: TuneConfig) -> tuple[list[str], list[list[str]]]:
    keys = [p.key for p in tc.params]
    header = ["trial", "state", *keys, "value", "steps", "collapsed", "job", "signature"]
    rows = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        ua = t.user_attrs
        onset = ua.get("collapse_onset")
        rows.append([
            str(t.number), t.state.name, *[short(t.params[k]) if k in t.params else "-" for k in keys],
            f"{t.value:.4f}" if t.value is not None and t.state.name == "COMPLETE" else "-",
            str(ua.get("steps_done", t.last_step if t.last_step is not None else "-")),
            "-" if t.state.name != "COMPLETE" else ("no" if onset is None else f"yes@{onset}"),
            str(ua.get("job_id", "-")), str(ua.get("spec_sig", "-")),
        ])
    return header, rows


def report(spec: SweepSpec, plots: bool = True, as_json: bool = False, out=None) -> Optional[dict]:
    """Print the trials table and the best value; save the optimisation-history and slice plots."""
    out = sys.stdout if out is None else out
    from optuna.trial import TrialState

    tc = parse_tune(spec)
    study = open_study(spec, tc, "", store_of(spec, tc), create=False)  # bound to its store: its best run is there
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    result = {"study": tc.study, "storage": redact(tc.storage), "n_trials": len(trials),
              "counts": {k: v for k, v in counts.items() if v},
              "best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params,
                                                 "signature": best.user_attrs.get("spec_sig")},
              "plots": []}
    if plots and complete:
        result["plots"] = save_plots(study, spec.sweep_dir, tc.params, tc.objective)
    if as_json:
        header, rows = trials_table(study, tc)
        result["trials"] = [dict(zip(header, r)) for r in rows]
        print(json.dumps(result), file=out)
        return result
    header, rows = trials_table(study, tc)
    print(f"study {tc.study!r} ({redact(tc.storage)}): {len(trials)} trials: "
          + ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v), file=out)
    print(format_table(rows, header), file=out)
    if best is None:
        print("no trial completed yet: no best value", file=out)
    else:
        params = ", ".join(f"{k} = {short(v)}" for k, v in best.params.items())
        print(f"best: {params} (trial {best.number}, objective {tc.objective.name} = {best.value:.4f}, "
              f"run {best.user_attrs.get('spec_sig', '?')})", file=out)
    for p in result["plots"]:
        print(f"plot: {p}", file=out)
    return result


def objective_label(objective: Objective) -> str:
    """The y label of the plots: what the objective value is."""
    return (f"{objective.name}: mean smoothed reward (W={objective.window}) over the last "
            f"{objective.tail_frac:.0%} of steps")


def save_plots(study, folder: Path, params: list[ParamSpec], objective: Optional[Objective] = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    quiet_optuna()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fn in (("optimization_history", lambda: ovm.plot_optimization_history(study)),
                     ("slice", lambda: ovm.plot_slice(study, params=[p.key for p in params]))):
        try:
            ax = fn()
        except Exception as exc:  # noqa: BLE001 - a plot must not lose the report
            print(f"warning: no {name} plot: {exc}", file=sys.stderr)
            continue
        axes = list(ax.flat) if hasattr(ax, "flat") else [ax]
        fig = axes[0].figure
        if objective is not None:  # name the objective (Optuna writes "Objective Value")
            for a in axes:
                if a.get_ylabel() == "Objective Value":
                    a.set_ylabel(objective_label(objective), fontsize=8)
        if name == "slice":  # show the whole search range, not just the sampled span
            for a, p in zip(axes, params):
                if p.type != "categorical":
                    a.set_xlim(p.low / 1.05 if p.log else p.low, p.high * 1.05 if p.log else p.high)
        fig.set_size_inches(7, 4.5)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths
