"""Job records and job states.

``JobsDB`` is ``<sweep_dir>/jobs.json``: run signature (or trial slot) -> the job that runs it (latest
submission). ``job_states`` reads where those jobs stand: from ``squeue`` (no accounting database
needed; ``sacct``, which submitit's own watcher uses, fails on a cluster without slurmdbd), then from
the JSON outcome each job leaves (``harness.launch.outcome``; submitit's result pickles are never
unpickled); a local job is its worker process.
"""
from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import submitit

from harness.launch import outcome


ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}


class JobsDB:
    """``<sweep_dir>/jobs.json``: signature -> the job that runs it (latest submission)."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / "jobs.json"
        self.data: dict[str, Any] = {"runs": {}, "trials": {}}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                data = None
            if isinstance(data, dict):  # anything else is not ours: as if no job had been recorded
                for key in ("runs", "trials"):
                    recs = data.get(key)
                    data[key] = {str(k): v for k, v in recs.items() if isinstance(v, dict)} \
                        if isinstance(recs, dict) else {}
                self.data.update(data)

    @property
    def runs(self) -> dict[str, dict]:
        return self.data.setdefault("runs", {})

    @property
    def trials(self) -> dict[str, dict]:
        return self.data.setdefault("trials", {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        tmp.replace(self.path)


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


def _result_state(folder: str, job_id: str, sweep_dir: Path | None) -> JobState:
    """The job's end from its JSON outcome (``harness.launch.outcome``; submitit's result pickles are never
    loaded: unpickling runs code). ``folder`` comes from jobs.json: read only when it lies under ``sweep_dir``."""
    where = _inside(folder, sweep_dir)
    if where is None:
        return JobState("LOST", False, f"jobs.json names the job folder {folder!r}, outside the sweep's folder "
                                          f"{sweep_dir}: not read")
    res = outcome.read(where, job_id)
    if res is None:
        paths = submitit.core.utils.JobPaths(where, job_id=job_id, task_id=0)
        return JobState("LOST", False, f"no result file; see {paths.stdout}")
    if res["outcome"] == "success":
        return JobState("DONE", False)
    return JobState("FAILED", False, res["detail"])


def _inside(folder: str, sweep_dir: Path | None) -> Path | None:
    """``folder`` resolved, when it lies under ``sweep_dir`` (resolved); None otherwise."""
    if not folder or sweep_dir is None:
        return None
    try:
        path, root = Path(folder).resolve(), Path(sweep_dir).resolve()
    except (OSError, RuntimeError):
        return None
    return path if path == root or root in path.parents else None


PF_KTHREAD = 0x00200000  # a kernel thread (linux/sched.h): its cmdline is always empty


def _pid_alive(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        cmd = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return alive_from_proc(stat, cmd)


def alive_from_proc(stat: str, cmdline: bytes) -> bool:
    """Whether ``/proc/<pid>/{stat,cmdline}`` describe a live local job (a submitit worker).

    An empty cmdline on a live user process means it is inside ``execve``: ``Popen`` (vfork) returns
    as soon as the child takes its new address space, before the kernel has written its arguments.
    Such a worker is alive; taking it for gone made ``--wait`` return before the run had finished."""
    fields = stat.rsplit(")", 1)[-1].split()
    state, flags = fields[0], int(fields[6])
    if state in ("Z", "X"):
        return False
    if not cmdline:
        return not flags & PF_KTHREAD
    return "submitit" in cmdline.replace(b"\0", b" ").decode(errors="replace")


def job_states(records: Iterable[dict], sweep_dir: Path | None) -> dict[str, JobState]:
    """``job_id -> JobState`` for records ``{job_id, launcher, folder}`` (from ``<sweep_dir>/jobs.json``; a
    ``folder`` outside ``sweep_dir`` is not read)."""
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
                res = _result_state(r.get("folder", ""), jid, sweep_dir)
                if res.state == "FAILED":  # the job script exited 0 but the callable raised
                    out[jid] = JobState("FAILED", False, res.detail)
                else:
                    out[jid] = JobState(st, False, "")
            else:
                out[jid] = _result_state(r.get("folder", ""), jid, sweep_dir)
                if squeue is None and out[jid].state == "LOST":
                    out[jid] = JobState("UNKNOWN", False, "squeue unavailable and no result file yet")
        else:
            out[jid] = JobState("RUNNING", True) if _pid_alive(jid) else _result_state(r.get("folder", ""), jid, sweep_dir)
    return out
