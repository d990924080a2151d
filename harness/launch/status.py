"""``python -m harness.status SPEC.yaml [OVERRIDE ...] [--json] [--blind]``: where every run of a sweep stands.

One row per run: its name, signature, the Slurm (or local) job, the state (the run's own result
when it is finished in the sweep's store, as ``harness.sweep`` decides: finished / diverged / pruned; else the scheduler's: PENDING, RUNNING, ...; else
what submitit's result files say), the last logged step, the smoothed reward there, and whether
the reward curve has collapsed (the report's own rule: ``harness.collapse.collapse_onset_index``
with its defaults). The reward is the report's **final** reward
(``harness.curves.final``: the mean of the last 10 logged rewards), the same number as the run line.
Progress comes
from MLflow (``harness.launch.progress``) (the run with the signature's ``spec_sig`` tag in the sweep's experiment). For an
Optuna spec (a ``tune:`` block) it prints the study's trials instead. ``--blind`` leaves every outcome out (no
reward, no collapse; a diverged run shown as finished at its last planned step: state and step only, the outcomes
not computed; refused for a tune spec, whose status is its objective values), so a pre-registered study can be
watched before its one analysis without seeing what it will analyse (docs/preregistration_v4.md).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Optional

from harness import curves
from harness.collapse import CollapseRule
from harness.launch.cli import cli, format_table, split_args
from harness.launch.expand import validate
from harness.launch.jobs import JobsDB, job_states
from harness.launch.progress import finished_in_store, mlflow_progress
from harness.launch.spec import SweepError, SweepSpec, load_spec
from harness.launch.sweep import summary_status
from harness.record import SUMMARY_FILE
from harness.uri import redact


USAGE = """usage: python -m harness.status SPEC.yaml [OVERRIDE ...] [--json] [--blind]

  Prints run, signature, job, state, step, final reward, collapsed? for every run of the sweep
  (the same overrides as harness.sweep select the same runs). --json: one JSON object per run.
  --blind: no outcome (final reward, collapse), only state and step: a pre-registered study watched before its analysis."""
OUTCOMES = ("reward", "collapsed")  # the columns --blind leaves out


@dataclass
class RunStatus:
    run: str
    signature: str
    job: str
    state: str
    step: Optional[int]  # steps logged so far (the last step + 1)
    steps: int  # planned
    reward: Optional[float]  # final reward so far: mean of the last 10 logged rewards (harness.curves.final)
    collapsed: Optional[int]  # collapse onset step, None if none
    mlflow_run: str = ""
    detail: str = ""


def sweep_status(spec: SweepSpec, outcomes: bool = True) -> list[RunStatus]:
    """Every run's row; ``outcomes=False``: its reward and collapse left None, not computed (``--blind``)."""
    from harness.collapse import collapse_onset_index

    runs = validate(spec)
    db = JobsDB(spec.sweep_dir)
    states = job_states(list(db.runs.values()), spec.sweep_dir)
    uri = runs[0].cfg.tracking_uri
    try:
        progress = mlflow_progress(uri, spec.experiment, [r.signature for r in runs])
        finished = finished_in_store(spec, runs)  # what the sweep skips: finished in this store, not a folder's file
    except Exception as exc:  # noqa: BLE001 - status must still show the scheduler's view
        print(f"warning: cannot read MLflow at {redact(uri)}: {exc}", file=sys.stderr)
        progress, finished = {}, set()
    rule = CollapseRule()
    rows = []
    for r in runs:
        rec = db.runs.get(r.signature, {})
        jid = str(rec.get("job_id", ""))
        js = states.get(jid) if jid else None
        summary_path = r.cfg.run_dir / SUMMARY_FILE
        detail = ""
        if r.signature in finished:
            # the run's own end (finished / diverged / pruned); blind: "finished" (a divergence is an outcome)
            state = summary_status(r.cfg.run_dir) if summary_path.exists() and outcomes else "finished"
        elif js is not None:
            state, detail = js.state, js.detail
            if js.alive and rec.get("launcher") == "local" and r.signature not in progress:
                state = "PENDING"
        else:
            state = "not submitted"
        p = progress.get(r.signature)
        step = reward = onset = None
        if p and p["rewards"]:
            step = p["steps"][-1] + 1
            if not outcomes and r.signature in finished:
                step = r.cfg.trainer.steps  # blind: a run that stopped early (diverged) reads as run to the end
        if p and p["rewards"] and outcomes:
            reward = curves.final(p["rewards"], curves.DEFAULT_FINAL_WINDOW)
            i = collapse_onset_index(p["rewards"], rule, p["losses"])
            onset = p["steps"][i] if i is not None and i < len(p["steps"]) else i
        rows.append(RunStatus(run=r.name or spec.name, signature=r.signature, job=jid, state=state, step=step,
                              steps=r.cfg.trainer.steps, reward=reward, collapsed=onset,
                              mlflow_run=p["run_id"] if p else "", detail=detail))
    return rows


def print_status(spec: SweepSpec, rows: list[RunStatus], out=None, blind: bool = False) -> None:
    out = sys.stdout if out is None else out
    header = ["run", "signature", "job", "state", "step"] + ([] if blind else ["final reward", "collapsed?"])
    table = []
    for s in rows:
        table.append([
            s.run, s.signature, s.job or "-", s.state + (f" ({s.detail})" if s.detail else ""),
            f"{s.step}/{s.steps}" if s.step is not None else f"-/{s.steps}",
        ] + ([] if blind else [
            f"{s.reward:.3f}" if s.reward is not None else "-",
            "-" if s.step is None else (f"yes@{s.collapsed}" if s.collapsed is not None else "no"),
        ]))
    print(f"sweep {spec.name} (MLflow experiment {spec.experiment!r}, jobs in {spec.sweep_dir / 'jobs.json'})", file=out)
    print(format_table(table, header), file=out)
    counts: dict[str, int] = {}
    for s in rows:
        counts[s.state] = counts.get(s.state, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())), file=out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        path, overrides, opts = split_args(argv, ("--json", "--blind"), USAGE)
        blind = "--blind" in opts
        spec = load_spec(path, overrides)
        if spec.tune is not None and blind:
            raise SweepError("--blind: a tune spec's status is its trials' objective values (outcomes); "
                             "leave --blind out, or watch its runs' progress with MLflow")
        if spec.tune is not None:
            from harness.launch.tune.report import report

            report(spec, plots=False, as_json="--json" in opts)
            return 0
        rows = sweep_status(spec, outcomes=not blind)
        if "--json" in opts:
            for s in rows:
                row = asdict(s)
                print(json.dumps({k: v for k, v in row.items() if not (blind and k in OUTCOMES)}))
        else:
            print_status(spec, rows, blind=blind)
        return 0

    return cli(body)
