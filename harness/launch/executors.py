"""submitit executors for sweeps and trials: Slurm job arrays, or worker processes on this machine.

What is submitted is a :class:`submitit.helpers.Checkpointable`: on preemption or timeout Slurm
sends USR2 (``signal_delay_s`` before the limit), submitit calls ``checkpoint()``, which returns a
``DelayedSubmission`` of the same callable, and requeues the job; the new job calls it again and
``harness.run.execute`` resumes from ``<run_dir>/checkpoint.pt`` into the same MLflow run. A job
that Slurm kills and requeues by itself (``scontrol requeue``, preemption with ``PreemptMode=REQUEUE``,
a node failure) re-runs the submitted callable, which resumes the same way.

Job state is read from ``squeue`` (no accounting database needed; ``sacct``, which submitit's own
watcher uses, fails on a cluster without slurmdbd), then from submitit's result files.
"""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}


class SubmissionError(RuntimeError):
    pass


# ------------------------------------------------------------------------------ the job callables
class RunJob(Checkpointable):
    """One run: build the resolved spec into a RunConfig and ``execute`` it (resuming if it can)."""

    def __init__(self, spec: dict[str, Any], tags: dict[str, str] | None = None, finished_after_ms: int = 0):
        self.spec = spec
        self.tags = tags or {}
        self.finished_after_ms = finished_after_ms  # a sweep's --rerun: older FINISHED runs do not count

    @property
    def signature(self) -> str:
        from harness.config import signature

        return signature(self.spec)

    def __call__(self) -> dict[str, Any]:
        from harness.config import build

        cfg = build(self.spec)
        summary = execute(cfg, tags=self.tags or None, finished_after_ms=getattr(self, "finished_after_ms", 0))
        return asdict(summary)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        # The run's state is on disk (checkpoint.pt, every trainer.checkpoint_every steps):
        # resubmitting the same callable resumes from it.
        return DelayedSubmission(RunJob(self.spec, self.tags, self.finished_after_ms), *args, **kwargs)


def job_for(cfg, finished_after_ms: int = 0) -> Checkpointable:
    """The callable a job runs for ``cfg``: the local backend's ``execute``, or verl's per-node
    launcher (Ray head on the first node, workers on the others; ``harness.backends.verl.launch``)."""
    if cfg.backend.name == "verl":
        from harness.backends.verl.launch import VerlJob

        return VerlJob(cfg.to_dict())
    return RunJob(cfg.to_dict(), finished_after_ms=finished_after_ms)


class PackJob(Checkpointable):
    """A seed pack: several seeds of one spec trained together in one process
    (``harness.backends.local.pack.execute_pack``), each seed its own MLflow run and checkpoint."""

    def __init__(self, specs: list[dict[str, Any]], finished_after_ms: int = 0):
        self.specs, self.finished_after_ms = specs, finished_after_ms

    def __call__(self) -> list[dict[str, Any]]:
        from harness.backends.local.pack import execute_pack
        from harness.config import build

        summaries = execute_pack([build(s) for s in self.specs], finished_after_ms=self.finished_after_ms)
        return [asdict(s) for s in summaries]

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(PackJob(self.specs, self.finished_after_ms), *args, **kwargs)


def seed_packs(cfgs: list, seeds_per_job: int) -> list[list[int]]:
    """Indices of ``cfgs`` grouped into jobs: up to ``seeds_per_job`` seeds of one spec (local
    backend) per job, in order of first appearance; every other run is a job of its own."""
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        key = cfg.group_signature if seeds_per_job > 1 and cfg.backend.name == "local" else f"#{i}"
        groups.setdefault(key, []).append(i)
    return [g[j:j + seeds_per_job] for g in groups.values() for j in range(0, len(g), max(1, seeds_per_job))]


def job_for_pack(cfgs: list, finished_after_ms: int = 0) -> Checkpointable:
    """One run: ``job_for``; several seeds of one spec: a :class:`PackJob`."""
    if len(cfgs) == 1:
        return job_for(cfgs[0], finished_after_ms)
    return PackJob([c.to_dict() for c in cfgs], finished_after_ms)


class Sequence(Checkpointable):
    """Several tasks one after the other in one job (the local launcher's workers). Tasks are
    idempotent (a finished run returns its summary at once), so a requeue simply calls it again."""

    def __init__(self, tasks: list[Callable[[], Any]]):
        self.tasks = list(tasks)

    def __call__(self) -> list[Any]:
        results, failed = [], []
        for i, task in enumerate(self.tasks):
            try:
                results.append(task())
            except Exception as exc:  # noqa: BLE001 - one bad run must not stop the others
                traceback.print_exc()
                failed.append(f"task {i}: {type(exc).__name__}: {exc}")
                results.append(None)
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(self.tasks)} tasks failed: " + "; ".join(failed))
        return results

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(Sequence(self.tasks), *args, **kwargs)


def execute(cfg, **kwargs):
    """``harness.run.execute`` without the progress bar (job logs are files, not terminals)."""
    from harness.run import execute as _execute

    return _execute(cfg, progress=False, **kwargs)


# ------------------------------------------------------------------------------------ submitting
def submitit_folder(spec) -> Path:
    return Path(spec.sweep_dir) / "submitit"


def _setup_lines(lc) -> list[str]:
    threads = lc.cpus_per_task
    return [f"export OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads}",
            "export PYTHONUNBUFFERED=1 TQDM_DISABLE=1", *lc.setup]


def slurm_parameters(spec) -> dict[str, Any]:
    lc = spec.launcher
    if lc.signal_delay_s >= lc.time_min * 60:
        from harness.launch.sweep import SweepError

        raise SweepError(f"launcher.signal_delay_s: {lc.signal_delay_s} s must be shorter than the time limit "
                         f"launcher.time_min={lc.time_min} min", key="launcher.signal_delay_s")
    params: dict[str, Any] = {
        "job_name": lc.job_name or spec.name, "time": lc.time_min, "nodes": lc.nodes,
        "ntasks_per_node": lc.tasks_per_node, "cpus_per_task": lc.cpus_per_task,
        "signal_delay_s": lc.signal_delay_s, "array_parallelism": lc.array_parallelism,
        "setup": _setup_lines(lc), "stderr_to_stdout": True,
    }
    if lc.partition:
        params["partition"] = lc.partition
    if lc.mem_gb is not None:
        params["mem"] = "0" if lc.mem_gb == 0 else f"{int(round(lc.mem_gb * 1024))}MB"
    if lc.gpus_per_node:
        params["gpus_per_node"] = lc.gpus_per_node
    for k in ("account", "qos", "constraint", "exclude"):
        if getattr(lc, k):
            params[k] = getattr(lc, k)
    if lc.additional:
        params["additional_parameters"] = {str(k).replace("_", "-"): v for k, v in lc.additional.items()}
    return params


def slurm_available() -> tuple[bool, str]:
    missing = [t for t in ("sbatch", "squeue", "scontrol", "srun") if shutil.which(t) is None]
    if missing:
        return False, f"Slurm client tools not found on PATH: {', '.join(missing)} (bash slurm/install.sh)"
    return True, ""


def submit(spec, tasks: list[Checkpointable], names: list[str] | None = None) -> list[str]:
    """Submit ``tasks``; returns one job id per task (``ARRAY_TASK`` ids for Slurm arrays, the
    worker's PID for the local launcher). Does not wait for anything to run."""
    if not tasks:
        return []
    folder = submitit_folder(spec)
    folder.mkdir(parents=True, exist_ok=True)
    lc = spec.launcher
    if lc.name == "slurm":
        ok, why = slurm_available()
        if not ok:
            raise SubmissionError(why)
        from harness.launch.sweep import SweepError

        try:
            ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=lc.max_requeues)
            ex.update_parameters(**slurm_parameters(spec))
        except ValueError as exc:
            if isinstance(exc, SweepError):
                raise
            raise SweepError(f"launcher: {exc}", key="launcher") from None
        try:
            with ex.batch():
                jobs = [ex.submit(t) for t in tasks]
        except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError, OSError) as exc:
            out = getattr(exc, "output", b"") or b""
            out = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
            out = out.strip() or str(exc)
            hint = ""
            if "configuration source" in out or "Unable to contact slurm controller" in out:
                hint = ("\nno Slurm controller reachable: set SLURM_CONF, or start a single-node cluster with "
                        "eval \"$(bash slurm/start.sh)\"")
            raise SubmissionError(f"sbatch failed: {out}{hint}") from None
        return [j.job_id for j in jobs]
    # local: `array_parallelism` worker processes (at most one per core: each run uses one thread),
    # each running its share of the tasks in order
    ex = submitit.LocalExecutor(folder=folder, max_num_timeout=lc.max_requeues)
    ex.update_parameters(timeout_min=lc.time_min, gpus_per_node=lc.gpus_per_node,
                         signal_delay_s=min(lc.signal_delay_s, lc.time_min * 30), setup=_setup_lines(lc))
    n = max(1, min(lc.array_parallelism, len(tasks), os.cpu_count() or 1))
    ids = [""] * len(tasks)
    for w in range(n):
        idx = list(range(w, len(tasks), n))
        job = ex.submit(Sequence([tasks[i] for i in idx]))
        for i in idx:
            ids[i] = job.job_id
    return ids


# ------------------------------------------------------------------------------------ job state
@dataclass
class JobState:
    state: str  # Slurm's state (PENDING, RUNNING, ...), or DONE / FAILED / LOST from result files
    alive: bool
    detail: str = ""


def _squeue_states() -> dict[str, tuple[str, str]] | None:
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%T|%r"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2:
            states[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return states


def _result_state(folder: str, job_id: str) -> JobState:
    paths = submitit.core.utils.JobPaths(folder, job_id=job_id, task_id=0)
    if paths.result_pickle.exists():
        try:
            outcome, result = submitit.core.utils.pickle_load(paths.result_pickle)
        except Exception:  # noqa: BLE001
            return JobState("DONE", False)
        if outcome == "success":
            return JobState("DONE", False)
        last = str(result).strip().splitlines()[-1] if str(result).strip() else ""
        return JobState("FAILED", False, last)
    return JobState("LOST", False, f"no result file; see {paths.stdout}")


def _pid_alive(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        cmd = Path(f"/proc/{int(pid)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and "submitit" in cmd


def job_states(records: Iterable[dict]) -> dict[str, JobState]:
    """``job_id -> JobState`` for records ``{job_id, launcher, folder}`` (from jobs.json)."""
    records = [r for r in records if r.get("job_id")]
    out: dict[str, JobState] = {}
    squeue = _squeue_states() if any(r.get("launcher") == "slurm" for r in records) else None
    for r in records:
        jid = str(r["job_id"])
        if r.get("launcher") == "slurm":
            if squeue is not None and jid in squeue:
                st, reason = squeue[jid]
                if st in ALIVE:
                    out[jid] = JobState(st, True, "" if reason in ("None", "") else reason)
                    continue
                res = _result_state(r.get("folder", ""), jid)
                if res.state == "FAILED":  # the job script exited 0 but the callable raised
                    out[jid] = JobState("FAILED", False, res.detail)
                else:
                    out[jid] = JobState(st, False, "")
            else:
                out[jid] = _result_state(r.get("folder", ""), jid)
                if squeue is None and out[jid].state == "LOST":
                    out[jid] = JobState("UNKNOWN", False, "squeue unavailable and no result file yet")
        else:
            out[jid] = JobState("RUNNING", True) if _pid_alive(jid) else _result_state(r.get("folder", ""), jid)
    return out


def cancel(records: Iterable[dict]) -> None:
    ids = [str(r["job_id"]) for r in records if r.get("launcher") == "slurm" and r.get("job_id")]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)
    for r in records:
        if r.get("launcher") == "local" and _pid_alive(str(r.get("job_id", ""))):
            os.kill(int(r["job_id"]), 2)


