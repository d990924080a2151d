"""Running a tune study: submit ``n_trials`` trial jobs (one slot each, recorded in ``jobs.json``), wait
for them, mark trials whose job ended without telling the study as FAIL, and report."""
from __future__ import annotations

import sys
import time
from typing import Optional

from harness.launch import submit
from harness.launch.expand import build_run
from harness.launch.jobs import JobsDB, job_states
from harness.launch.progress import prepare_tracking
from harness.launch.spec import SweepSpec
from harness.launch.tune.report import report
from harness.launch.tune.spec import TuneConfig, parse_tune, store_of, trial_overrides, validate_tune
from harness.launch.tune.study import open_study
from harness.launch.tune.trial import TrialJob, short
from harness.uri import redact


def submit_trials(spec: SweepSpec, tc: TuneConfig, study, n: int, out=None) -> list[int]:
    out = sys.stdout if out is None else out
    db = JobsDB(spec.sweep_dir)
    first = max((int(s) for s in db.trials), default=-1) + 1
    slots = list(range(first, first + n))
    tasks = [TrialJob(spec, tc, s) for s in slots]
    job_ids = submit.submit(spec, tasks, [f"trial-slot-{s}" for s in slots])
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    folder = str(submit.submitit_folder(spec))
    db = JobsDB(spec.sweep_dir)  # re-read: another tune may have written meanwhile
    for s, jid in zip(slots, job_ids):
        db.trials[str(s)] = {"job_id": jid, "launcher": spec.launcher.name, "folder": folder, "submitted": now}
    db.save()
    shown = sorted(set(j.split("_")[0] for j in job_ids))
    print(f"submitted {n} trials (slots {slots[0]}-{slots[-1]}) of study {tc.study!r} as {spec.launcher.name} "
          f"job{'s' if len(shown) > 1 else ''} {', '.join(shown)}; storage {redact(tc.storage)}", file=out)
    return slots


def wait_trials(spec: SweepSpec, tc: TuneConfig, study, slots: list[int], timeout: float | None = None,
                poll_s: float = 2.0, out=None) -> bool:
    """Wait until every slot's job has ended; print each trial as it finishes. False on timeout."""
    out = sys.stdout if out is None else out
    t0 = time.time()
    seen: set[int] = set()
    wanted = set(slots)
    while True:
        db = JobsDB(spec.sweep_dir)
        recs = [db.trials[str(s)] for s in slots if str(s) in db.trials]
        states = job_states(recs, spec.sweep_dir)
        alive = [r for r in recs if states.get(str(r["job_id"])) and states[str(r["job_id"])].alive]
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("slot") in wanted and t.number not in seen and t.state.is_finished():
                seen.add(t.number)
                params = " ".join(f"{k}={short(v)}" for k, v in t.params.items())
                val = f"value {t.value:.4f}" if t.value is not None and t.state.name == "COMPLETE" else ""
                step = f"at step {t.last_step}" if t.state.name == "PRUNED" and t.last_step else ""
                print(f"  trial {t.number:3d} {t.state.name:8s} {params} {val}{step} "
                      f"({time.time() - t0:.0f} s)", file=out)
        if not alive:
            mark_lost(spec, study, slots)
            return True
        if timeout is not None and time.time() - t0 > timeout:
            print(f"stopped waiting after {timeout:.0f} s: {len(alive)} jobs still queued/running", file=out)
            return False
        time.sleep(poll_s)


def mark_lost(spec: SweepSpec, study, slots: list[int]) -> None:
    """Trials still RUNNING whose job has ended without telling the study (killed, out of requeues)
    -> FAIL; so are trials that never got a slot (a job killed between ask and set_user_attr) once
    no trial job of this sweep is alive."""
    from optuna.trial import TrialState

    db = JobsDB(spec.sweep_dir)
    recs = {int(s): r for s, r in db.trials.items()}
    states = job_states(list(recs.values()), spec.sweep_dir)
    none_alive = not any(st.alive for st in states.values())
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        slot = t.user_attrs.get("slot")
        rec = recs.get(slot) if slot is not None else None
        st = states.get(str(rec["job_id"])) if rec else None
        if (st is not None and not st.alive) or (slot is None and none_alive):
            print(f"  trial {t.number:3d} FAIL     its job ({rec['job_id'] if rec else '?'}) ended without a result",
                  file=sys.stderr)
            study.tell(t.number, state=TrialState.FAIL)


def run_tune(spec: SweepSpec, wait: bool = True, timeout: float | None = None, out=None) -> Optional[dict]:
    out = sys.stdout if out is None else out
    tc = parse_tune(spec)
    base_sig = validate_tune(spec, tc)
    study = open_study(spec, tc, base_sig, store_of(spec, tc))  # bound to its store: another store is exit 2
    before = len(study.get_trials(deepcopy=False))
    prepare_tracking(spec, build_run(spec, trial_overrides(spec, {p.key: p.extremes()[0] for p in tc.params})))
    print(f"study {tc.study!r}: {before} trials so far; adding {tc.n_trials}; launcher {spec.launcher.name}; "
          f"pruner {tc.pruner.get('name', 'median')}; objective {tc.objective.name}", file=out)
    slots = submit_trials(spec, tc, study, tc.n_trials, out=out)
    if not wait:
        return None
    wait_trials(spec, tc, study, slots, timeout=timeout, out=out)
    return report(spec, out=out)
