"""Submission through submitit: Slurm job arrays, or worker processes on this machine.

What is submitted is each run's backend job (``harness.backends``: ``job`` per run, ``pack`` per seed pack),
a :class:`submitit.helpers.Checkpointable`: on preemption or timeout Slurm
sends USR2 (``signal_delay_s`` before the limit), submitit calls ``checkpoint()``, which returns a
``DelayedSubmission`` of the same callable, and requeues the job; the new job calls it again and
the run resumes from ``<run_dir>/checkpoint.pt`` into the same MLflow run. A job
that Slurm kills and requeues by itself (``scontrol requeue``, preemption with ``PreemptMode=REQUEUE``,
a node failure) re-runs the submitted callable, which resumes the same way.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from harness import backends
from harness.launch.outcome import Reported
from harness import container
from harness.launch.spec import SweepError


class SubmissionError(RuntimeError):
    pass


def job_for(cfg, finished_after_ms: int = 0) -> Checkpointable:
    """The callable a job runs for ``cfg``: its backend's job (local: ``execute``; verl: the per-node
    launcher, Ray head on the first node, workers on the others)."""
    return backends.get(cfg.backend.name).job(cfg, finished_after_ms)


def seed_packs(cfgs: list, seeds_per_job: int) -> list[list[int]]:
    """Indices of ``cfgs`` grouped into jobs: up to ``seeds_per_job`` seeds of one spec (a
    packable backend) per job, in order of first appearance; every other run is a job of its own."""
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        key = cfg.group_signature if seeds_per_job > 1 and backends.get(cfg.backend.name).packable else f"#{i}"
        groups.setdefault(key, []).append(i)
    return [g[j:j + seeds_per_job] for g in groups.values() for j in range(0, len(g), max(1, seeds_per_job))]


def job_for_pack(cfgs: list, finished_after_ms: int = 0) -> Checkpointable:
    """One run: ``job_for``; several seeds of one spec: the backend's pack."""
    if len(cfgs) == 1:
        return job_for(cfgs[0], finished_after_ms)
    return backends.get(cfgs[0].backend.name).pack(cfgs, finished_after_ms)


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


def submitit_folder(spec) -> Path:
    return Path(spec.sweep_dir) / "submitit"


def _setup_lines(lc) -> list[str]:
    threads = lc.cpus_per_task
    return [f"export OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads}",
            "export PYTHONUNBUFFERED=1 TQDM_DISABLE=1", *lc.setup]


def slurm_parameters(spec) -> dict[str, Any]:
    lc = spec.launcher
    if lc.signal_delay_s >= lc.time_min * 60:
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
    args = container.srun_args(container.parse(lc.container))
    if args:
        params["srun_args"] = args
    return params


def slurm_python(spec) -> str:
    """The command that starts the job's python in each step: this interpreter, or the image's
    (``launcher.container``, harness.launch.container)."""
    return container.python_command(container.parse(spec.launcher.container), sys.executable)


def slurm_available() -> tuple[bool, str]:
    missing = [t for t in ("sbatch", "squeue", "scontrol", "srun") if shutil.which(t) is None]
    if missing:
        return False, f"Slurm client tools not found on PATH: {', '.join(missing)} (bash slurm/install.sh)"
    return True, ""


def submit(spec, tasks: list[Checkpointable], names: list[str] | None = None) -> list[str]:
    """Submit ``tasks``; returns one job id per task (``ARRAY_TASK`` ids for Slurm arrays, the
    worker's PID for the local launcher). Does not wait for anything to run. Each job leaves its outcome as
    JSON (``harness.launch.outcome.Reported``), which is what ``harness.status`` reads."""
    if not tasks:
        return []
    folder = submitit_folder(spec)
    folder.mkdir(parents=True, exist_ok=True)
    lc = spec.launcher
    if lc.name == "slurm":
        ok, why = slurm_available()
        if not ok:
            raise SubmissionError(why)
        try:
            ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=lc.max_requeues, python=slurm_python(spec))
            ex.update_parameters(**slurm_parameters(spec))
        except ValueError as exc:
            if isinstance(exc, SweepError):
                raise
            raise SweepError(f"launcher: {exc}", key="launcher") from None
        try:
            with ex.batch():
                jobs = [ex.submit(Reported(t)) for t in tasks]
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
    with _console_to(folder / CONTROLLER_LOG):
        for w in range(n):
            idx = list(range(w, len(tasks), n))
            job = ex.submit(Reported(Sequence([tasks[i] for i in idx])))
            for i in idx:
                ids[i] = job.job_id
    return ids


CONTROLLER_LOG = "local_controller.log"


@contextmanager
def _console_to(log: Path):
    """Standard output and error of the local workers started inside (submitit's controller process inherits this
    process's) go to ``log``, not the console: a Ctrl-C on ``sweep --wait`` reaches the whole process group, and the
    controller's KeyboardInterrupt traceback landed on the console under the sweep's one line (issue 45). The
    runs' own logs are submitit's ``<job>_0_log.*`` files, as before."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
