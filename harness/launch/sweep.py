"""Sweeps: a YAML spec -> many runs -> validated whole -> submitted through submitit.

``python -m harness.sweep SPEC.yaml [OVERRIDE ...] [--rerun] [--dry-run] [--wait]``

The spec and its command-line overrides: ``harness.launch.spec``; its runs: ``harness.launch.expand``.

Identity: every run is built into a :class:`harness.spec.RunConfig` before anything is
submitted (one bad value -> one error naming the run and the key, exit 2, nothing submitted).
A run is finished when the sweep's MLflow store holds a FINISHED run of its signature in the sweep's
experiment (``harness.store``; a ``summary.json`` left in a folder does not count): it is skipped; a
run whose recorded job is still pending/running is left alone; ``--rerun`` resubmits finished runs
from scratch (their folder files kept as ``*.prev-<time>``; the old MLflow runs stay, superseded).
The store is checked first (seconds; unreachable: exit 1) and every job logs to that same store.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import backends
from harness.launch import primary, submit
from harness.launch.cli import cli, split_args
from harness.launch.expand import PlannedRun, validate
from harness.launch.jobs import JobsDB, job_states
from harness.launch.progress import finished_in_store, prepare_tracking
from harness.launch.spec import SweepError, SweepSpec, load_spec
from harness.runlock import NotALockFile, RunInProgress, RunLock
from harness.record import CHECKPOINT_FILE, SUMMARY_FILE


USAGE = """usage: python -m harness.sweep SPEC.yaml [OVERRIDE ...] [--rerun] [--dry-run] [--wait]

  SPEC.yaml      a sweep spec (sweeps/*.yaml)
  OVERRIDE       launcher=slurm|local, launcher.KEY=VALUE, experiment=NAME, seeds=[0,1],
                 runs_dir=PATH, sweep_dir=PATH, or any run override key=value (added to base)
  --rerun        resubmit runs that already finished (from scratch); running ones are left alone
  --dry-run      validate and print the plan; submit nothing
  --wait         block until every run of the sweep has finished (the demo uses it)
Exit status: 0 submitted (or nothing to do), 2 invalid spec (nothing submitted), 1 submission failed
(with --wait: a run failed)."""


@dataclass
class Decision:
    run: PlannedRun
    action: str  # submit | finished | running
    detail: str = ""
    after_ms: int = 0  # --rerun: the run is done when a FINISHED run started at or after this time is in the store


def plan(spec: SweepSpec, runs: list[PlannedRun], rerun: bool = False) -> list[Decision]:
    finished = finished_in_store(spec, runs)
    db = JobsDB(spec.sweep_dir)
    recorded = {sig: rec for sig, rec in db.runs.items() if rec.get("job_id")}
    states = job_states(list(recorded.values()), spec.sweep_dir)
    out = []
    for r in runs:
        rec = recorded.get(r.signature)
        state = states.get(rec["job_id"]) if rec else None
        if rec and state is not None and state.alive:
            out.append(Decision(r, "running", f"job {rec['job_id']} {state.state}"))
        elif r.signature in finished and not rerun:
            out.append(Decision(r, "finished", summary_status(r.cfg.run_dir)))
        else:
            out.append(Decision(r, "submit", "rerun" if r.signature in finished else ""))
    return out


def summary_status(run_dir: Path) -> str:
    """The status its ``summary.json`` gives a finished run (finished / diverged / pruned)."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text()).get("status", "finished")
    except (OSError, json.JSONDecodeError):
        return "finished"


def archive_finished(run_dir: Path, run_files: tuple[str, ...] = ()) -> None:
    """--rerun: keep the previous result beside the folder, and start the run from scratch (``run_files``: the
    backend's own, ``Backend.run_files``; a verl run's MLflow run id, pinned commit and checkpoints: a new
    MLflow run)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (SUMMARY_FILE, CHECKPOINT_FILE, *run_files):
        p = run_dir / name
        if p.exists():
            p.replace(run_dir / f"{name}.prev-{stamp}")


def submit_sweep(spec: SweepSpec, rerun: bool = False, dry_run: bool = False, out=None) -> list[Decision]:
    """Validate, plan and submit; returns the decisions (what was submitted, skipped, left alone). Planning and
    submitting hold the sweep folder's ``submit.lock`` (not for a dry run): two submissions of one sweep at once
    would both see its runs as not submitted and submit them twice; the second stops, exit 2, naming the first."""
    out = sys.stdout if out is None else out
    t0 = time.time()
    runs = validate(spec)
    if dry_run:
        return _submit(spec, runs, rerun, True, out, t0)
    lock = RunLock(spec.sweep_dir, "submit.lock", "is submitting the sweep in")
    try:
        spec.sweep_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except NotALockFile as exc:
        raise SweepError(f"sweep {spec.name}: {exc}", key="name") from None
    except OSError as exc:  # a read-only or full sweep folder: one line, not a traceback
        raise SweepError(f"sweep {spec.name}: cannot write the sweep folder {spec.sweep_dir} "
                         f"({exc.strerror or exc}): make it writable, or choose another (sweep_dir=PATH)",
                         key="sweep_dir") from None
    except RunInProgress as exc:
        raise SweepError(f"sweep {spec.name}: {str(exc).split(';')[0].replace('run in progress', 'submission in progress')}"
                         f"; run it again once that one has submitted (it then skips or leaves alone what is submitted)",
                         key="name") from None
    try:
        return _submit(spec, runs, rerun, False, out, t0)
    finally:
        lock.release()


def _submit(spec: SweepSpec, runs: list[PlannedRun], rerun: bool, dry_run: bool, out, t0: float) -> list[Decision]:
    """The plan and the submission of :func:`submit_sweep` (under its lock)."""
    decisions = plan(spec, runs, rerun=rerun)
    todo = [d for d in decisions if d.action == "submit"]
    n_fin = sum(d.action == "finished" for d in decisions)
    n_run = sum(d.action == "running" for d in decisions)
    print(f"sweep {spec.name}: {len(runs)} runs valid ({time.time() - t0:.1f} s); {len(todo)} to submit, "
          f"{n_fin} finished (skipped), {n_run} running (left alone); launcher {spec.launcher.name}; "
          f"MLflow experiment {spec.experiment!r}", file=out)
    if dry_run:
        for d in decisions:
            print(f"  {d.action:8s} {d.run.signature}  {d.run.name or 'base'}  {d.detail}", file=out)
        return decisions
    if not todo:
        return decisions
    prepare_tracking(spec, todo[0].run.cfg)
    declared = primary.declare(spec, todo[0].run.cfg.tracking_uri)  # before any job starts (harness/launch/primary.py)
    if declared:
        print(f"primary contrasts ({len(declared['contrasts'])}) declared at "
              f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(declared['declared_at_ms'] / 1000))} UTC in "
              f"{spec.sweep_dir / primary.FILE}", file=out)
    after_ms = 0
    if rerun:
        after_ms = int(time.time() * 1000)  # the jobs' runs: a FINISHED run older than this does not count
        for d in todo:
            archive_finished(d.run.cfg.run_dir, backends.get(d.run.cfg.backend.name).run_files)
            d.after_ms = after_ms
    packs = submit.seed_packs([d.run.cfg for d in todo], spec.launcher.seeds_per_job)  # [[index in todo]]
    tasks = [submit.job_for_pack([todo[i].run.cfg for i in p], finished_after_ms=after_ms) for p in packs]
    names = [todo[p[0]].run.name or spec.name for p in packs]
    job_ids = [""] * len(todo)
    for p, jid in zip(packs, submit.submit(spec, tasks, names)):
        for i in p:
            job_ids[i] = jid
    db = JobsDB(spec.sweep_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    for d, jid in zip(todo, job_ids):
        prev = db.runs.get(d.run.signature, {})
        db.runs[d.run.signature] = {
            "job_id": jid, "launcher": spec.launcher.name, "name": d.run.name, "submitted": now,
            "run_dir": str(d.run.cfg.run_dir), "folder": str(submit.submitit_folder(spec)),
            "history": (prev.get("history", []) + [prev["job_id"]])[-20:] if prev.get("job_id") else [],
        }
    db.save()
    shown = sorted(set(j.split("_")[0] for j in job_ids))
    print(f"submitted {len(todo)} runs as {spec.launcher.name} job{'s' if len(shown) > 1 else ''} "
          f"{', '.join(shown)} ({time.time() - t0:.1f} s); jobs recorded in {db.path}", file=out)
    return decisions


HEARTBEAT_S = 60.0  # seconds between "still waiting" lines of --wait when no run finishes


def heartbeat(total: int, pending: int, states: dict, elapsed: float) -> str:
    """One line of where a waiting sweep stands: done, running, queued (by the jobs' states), elapsed."""
    alive = [s for s in states.values() if s is not None and s.alive]
    running = sum(s.state == "RUNNING" for s in alive)
    return (f"[{total - pending}/{total}] waiting: {total - pending} done, {running} job(s) running, "
            f"{len(alive) - running} queued ({elapsed / 60:.1f} min)")


def next_poll(delay: float, news: bool, first: float, most: float) -> float:
    """The wait before the next look at the store: back to ``first`` after news (a run finished or failed), else
    1.25x the last wait, at most ``most``. Each look loads every FINISHED run of the experiment (a few hundred in a
    study, ~0.4 s of CPU each at 5 s intervals, taken from the jobs it waits for); a run takes minutes, so a run
    that finishes is seen within ``most`` seconds and a study's waiter looks ~10x less often than every 5 s."""
    return first if news else min(most, delay * 1.25)


def wait_for(spec: SweepSpec, decisions: list[Decision], poll_s: float = 5.0, out=None,
             heartbeat_s: float = HEARTBEAT_S, max_poll_s: float = 60.0) -> int:
    """Block until every submitted or running run of the sweep has finished (``--wait``).

    Finished = finished in the sweep's store (:func:`finished_in_store`). A job that is over without
    that has failed: the number of such runs is returned (0 = all finished), with the job's last error line.
    Every ``heartbeat_s`` without news it prints where the sweep stands (:func:`heartbeat`). It looks every
    ``poll_s`` seconds at first, less often while nothing happens (:func:`next_poll`, at most ``max_poll_s``).
    """
    out = sys.stdout if out is None else out
    pending = {d.run.signature: d for d in decisions if d.action in ("submit", "running")}
    total, failed, t0 = len(pending), 0, time.time()
    last_line, delay = t0, poll_s
    while pending:
        time.sleep(delay)
        before = len(pending)
        if time.time() - last_line >= heartbeat_s:
            db = JobsDB(spec.sweep_dir)
            jobs = {str(db.runs[s]["job_id"]): db.runs[s] for s in pending if s in db.runs}
            print(heartbeat(total, len(pending), job_states(list(jobs.values()), spec.sweep_dir),
                            time.time() - t0), file=out, flush=True)
            last_line = time.time()
        db = JobsDB(spec.sweep_dir)
        states = job_states([db.runs[s] for s in pending if s in db.runs], spec.sweep_dir)
        done = _finished(spec, list(pending.values()))
        for sig, d in list(pending.items()):
            run = d.run
            if sig in done:
                del pending[sig]
                print(f"[{total - len(pending)}/{total}] {run.name or spec.name} ({sig}) finished "
                      f"({time.time() - t0:.0f} s)", file=out, flush=True)
                last_line = time.time()
                continue
            st = states.get(str(db.runs.get(sig, {}).get("job_id", "")))
            if st is not None and not st.alive and st.state in ("DONE", "FAILED", "LOST", "COMPLETED"):
                if sig in _finished(spec, [d]):
                    continue  # finished between the two looks
                del pending[sig]
                failed += 1
                print(f"[{total - len(pending)}/{total}] {run.name or spec.name} ({sig}) FAILED: {st.state} "
                      f"{st.detail}", file=out, flush=True)
        delay = next_poll(delay, len(pending) < before, poll_s, max_poll_s)
    return failed


def _finished(spec: SweepSpec, decisions: list[Decision]) -> set[str]:
    """Signatures of ``decisions`` finished in the store; a --rerun's run by a run started after its submission
    (the FINISHED run it supersedes is still there)."""
    out: set[str] = set()
    for after in {d.after_ms for d in decisions}:
        out |= finished_in_store(spec, [d.run for d in decisions if d.after_ms == after], after)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        path, overrides, opts = split_args(argv, ("--rerun", "--dry-run", "--wait"), USAGE)
        spec = load_spec(path, overrides)
        if spec.tune is not None:
            raise SweepError(f"{path} is an Optuna study (it has a `tune:` block): run python -m harness.tune {path}")
        decisions = submit_sweep(spec, rerun="--rerun" in opts, dry_run="--dry-run" in opts)
        if "--wait" in opts and "--dry-run" not in opts:
            try:
                return 1 if wait_for(spec, decisions) else 0
            except KeyboardInterrupt:  # the jobs are the launcher's: they go on (or were interrupted with us)
                print(f"\nsweep {spec.name}: stopped waiting (Ctrl-C); `python -m harness.status {path}` shows the "
                      "runs, the same sweep command resumes what did not finish", file=sys.stderr)
                return 130
        return 0

    return cli(body)
