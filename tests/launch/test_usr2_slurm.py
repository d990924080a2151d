"""Slurm's USR2 on the submitit path against a stand-in of verl's process group (issue 44, signals.py).

submitit asks for ``--signal=USR2@<delay>`` without ``B:``: Slurm sends USR2 to the processes of the job step, not only
to submitit's python. The job here (``StandIn``, submitted through ``harness.launch.submit`` as a sweep's jobs are)
starts a FAKE verl (named so: a python standing for ``main_ppo``, which starts a child standing for a raylet; both
only record their pids and sleep) the way ``runner.train`` starts ``main_ppo``: ``signals.run_shielded``. A forced
``scancel --signal=USR2`` reaches the step; submitit's handler calls ``StandIn.checkpoint``, which records which
stand-in processes are still alive, and requeues. Shielded, both live on to the checkpoint; started with a plain
``subprocess.run`` (as before issue 44), USR2's default action ends them. Real single-node Slurm (conftest.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import yaml
from submitit.helpers import Checkpointable, DelayedSubmission

from harness.backends.verl.signals import run_shielded
from harness.launch.spec import load_spec
from harness.launch.submit import submit

#: FAKE verl: "main_ppo" starts a "raylet" child (the same code, argv[2] == "child"); both append their pid to
#: <folder>/pids and sleep until the step ends
STAND_IN = """
import os, subprocess, sys, time
folder = sys.argv[1]
with open(os.path.join(folder, "pids"), "a") as f:
    f.write(f"{os.getpid()}\\n")
if len(sys.argv) == 2:
    subprocess.Popen([sys.executable, __file__, folder, "child"])
time.sleep(300)
"""


class StandIn(Checkpointable):
    """First start: the FAKE verl group, waited for; after the requeue: returns at once."""

    def __init__(self, folder: str, shielded: bool):
        self.folder, self.shielded = folder, shielded

    def __call__(self) -> str:
        f = Path(self.folder)
        if (f / "checkpoint.json").exists():
            (f / "second_start").write_text("resumed")
            return "resumed"
        script = f / "fake_verl.py"
        script.write_text(STAND_IN)
        (run_shielded if self.shielded else subprocess.run)([sys.executable, str(script), self.folder])
        time.sleep(120)  # (a stand-in that USR2 ended returns at once: submitit's handler still has to run)
        return "the stand-in ended"

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        time.sleep(1.0)  # USR2 has reached every process of the step by now
        pids = [int(p) for p in (Path(self.folder) / "pids").read_text().split()]
        alive = {}
        for pid in pids:
            try:
                os.kill(pid, 0)
                status = Path(f"/proc/{pid}/stat").read_text().split()[2]
                alive[pid] = status != "Z"  # a zombie has died: its parent has not reaped it yet
            except (ProcessLookupError, FileNotFoundError):
                alive[pid] = False
        (Path(self.folder) / "checkpoint.json").write_text(json.dumps(alive))
        return DelayedSubmission(StandIn(self.folder, self.shielded), *args, **kwargs)


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job unpickles StandIn without this test module


def _state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def _until(cond, timeout: float, what: str, folder: Path) -> None:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in folder.rglob("*_log.out"))
            pytest.fail(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.2)


def _usr2_against(tmp_path: Path, shielded: bool) -> dict[str, bool]:
    tmp_path.mkdir(parents=True)
    p = tmp_path / "usr2.yaml"
    p.write_text(yaml.safe_dump({"name": "usr2", "base": ["trainer.steps=2"], "runs_dir": str(tmp_path / "runs"),
                                 "launcher": {"name": "slurm", "time_min": 10, "mem_gb": 1, "signal_delay_s": 60}}))
    spec = load_spec(p, [])
    folder = tmp_path / "stand_in"
    folder.mkdir()
    (job,) = submit(spec, [StandIn(str(folder), shielded)])
    _until(lambda: (folder / "pids").exists() and len((folder / "pids").read_text().split()) == 2, 90,
           "the stand-in verl group", spec.sweep_dir)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    _until(lambda: (folder / "checkpoint.json").exists(), 60, "submitit's checkpoint", spec.sweep_dir)
    _until(lambda: (folder / "second_start").exists() or _state(job) == "GONE", 120, "the requeued start",
           spec.sweep_dir)
    assert (folder / "second_start").exists(), "the job was not requeued and started again"
    return json.loads((folder / "checkpoint.json").read_text())


def test_usr2_reaches_the_step_and_the_shielded_verl_group_lives_on(slurm_cluster, tmp_path):
    shielded = _usr2_against(tmp_path / "shielded", True)
    plain = _usr2_against(tmp_path / "plain", False)
    assert len(shielded) == 2 and all(shielded.values()), shielded  # main_ppo and its raylet, alive at the checkpoint
    assert len(plain) == 2 and not any(plain.values()), plain  # unshielded (before issue 44): USR2 ended both
