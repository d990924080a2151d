"""Helpers shared by the launch tests (imported by module name: tests/launch is on sys.path)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from harness.uri import ROOT

SWEEPS = ROOT / "sweeps"


def where(root: Path, uri: str, name: str) -> list[str]:
    """Overrides that put a sweep's runs, jobs and MLflow experiment under the test's folders."""
    return [f"runs_dir={root / name / 'runs'}", f"tracking_uri={uri}", f"experiment={name}"]


def wait_sweep(spec, timeout: float = 240.0, cluster=None) -> None:
    """Until no job recorded for the sweep is pending/running; fail with the job logs on timeout."""
    from harness.launch.jobs import JobsDB, job_states

    t0 = time.time()
    while time.time() - t0 < timeout:
        db = JobsDB(spec.sweep_dir)
        recs = list(db.runs.values()) + list(db.trials.values())
        states = job_states(recs, spec.sweep_dir)
        if not any(s.alive for s in states.values()):
            return
        time.sleep(1.0)
    pytest.fail(f"sweep {spec.name} still running after {timeout:.0f} s:\n{job_logs(spec)}\n"
                + (cluster.log_tail() if cluster else ""))


def job_logs(spec, n: int = 15) -> str:
    folder = Path(spec.sweep_dir) / "submitit"
    out = []
    for p in sorted(folder.glob("*_log.*")):
        out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:]))
    return "\n".join(out)


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def job_state(job_id: str) -> str:
    """A Slurm job's state as squeue shows it, or GONE once it left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def wait_for(cond, timeout: float, what: str, spec) -> None:
    """Until ``cond()``; fail naming ``what`` with the sweep's job logs on timeout."""
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            pytest.fail(f"timed out waiting for {what}\n{job_logs(spec)}")
        time.sleep(0.2)
