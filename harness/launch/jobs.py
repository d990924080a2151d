"""Job records and job states.

``JobsDB`` is ``<sweep_dir>/jobs.json``: run signature (or trial slot) -> the job that runs it (latest
submission). ``job_states`` reads where those jobs stand: from ``squeue`` (no accounting database
needed; ``sacct``, which submitit's own watcher uses, fails on a cluster without slurmdbd), then from
submitit's result files; a local job is its worker process.
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


ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}


class JobsDB:
    """``<sweep_dir>/jobs.json``: signature -> the job that runs it (latest submission)."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / "jobs.json"
        self.data: dict[str, Any] = {"runs": {}, "trials": {}}
        if self.path.exists():
            try:
                self.data.update(json.loads(self.path.read_text()))
            except json.JSONDecodeError:
                pass

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
