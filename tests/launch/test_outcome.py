"""Job outcomes as JSON (harness.launch.outcome): no command unpickles a file a user could have written
(issue 45, wrong case 1: on d747b32 ``harness.status`` ran a crafted ``<job>_0_result.pkl``)."""
from __future__ import annotations

import functools
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

from harness.launch import outcome, status, submit, sweep
from harness.launch.jobs import JobsDB, job_states
from harness.launch.spec import load_spec

from launch_helpers import SWEEPS, where


class Crafted:
    """Unpickled, it creates the file ``marker`` (any command would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def plant(path: Path, marker: Path) -> None:
    """A pickle at ``path`` that runs ``Crafted`` when loaded; checked live, then ``marker`` removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(("success", Crafted(marker))))
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()


def dead_pid() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return str(proc.pid)


def _spec(root: Path, uri: str, name: str, *extra: str):
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[recompute]", "seeds=[0]",
            *where(root, uri, name), *extra]
    return args, load_spec(args[0], args[1:])


def test_a_crafted_pickle_anywhere_a_status_or_a_wait_looks_runs_nothing(store, tmp_path, capsys):
    """Crafted pickles under every name submitit gives a job's files, in the sweep's submitit folder and in a
    folder outside the sweep that jobs.json names; then status, the sweep's plan, --wait's look and the
    tune driver's look at the jobs. On d747b32 the status ran the result pickle (the marker was created)."""
    from harness.launch.tune.driver import mark_lost

    root, uri = store
    args, spec = _spec(root, uri, "crafted_status")
    marker = tmp_path / "MARKER"
    inside, outside = submit.submitit_folder(spec), tmp_path / "elsewhere"
    ids = {"run": dead_pid(), "run_out": dead_pid(), "trial": dead_pid()}
    for folder in (inside, outside):
        for jid in ids.values():
            for name in ("result", "submitted"):
                plant(folder / f"{jid}_0_{name}.pkl", marker)
            plant(folder / f"{jid}_submitted.pkl", marker)
    db = JobsDB(spec.sweep_dir)
    (run,) = sweep.validate(spec)
    db.runs[run.signature] = {"job_id": ids["run"], "launcher": "local", "folder": str(inside)}
    db.runs["other"] = {"job_id": ids["run_out"], "launcher": "local", "folder": str(outside)}
    db.trials["0"] = {"job_id": ids["trial"], "launcher": "local", "folder": str(inside)}
    db.save()

    assert status.main(args + ["--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["state"] == "LOST" and "no result file" in row["detail"]  # d747b32: DONE, read from the pickle
    states = job_states(list(db.runs.values()) + list(db.trials.values()), spec.sweep_dir)
    assert states[ids["run_out"]].state == "LOST" and "outside the sweep's folder" in states[ids["run_out"]].detail
    assert [d.action for d in sweep.plan(spec, [run])] == ["submit"]
    assert sweep.wait_for(spec, [sweep.Decision(run, "running")], poll_s=0.01, out=sys.stdout) == 1
    mark_lost(spec, type("NoStudy", (), {"get_trials": lambda self, **kw: []})(), [0])
    assert not marker.exists()


def test_a_local_job_leaves_its_outcome_as_json_and_the_status_reads_it(store):
    """Two real local jobs (submitit workers): one returns, one raises; their states come from the JSON each
    left, with the error's last line; no result pickle is read."""
    root, uri = store
    _, spec = _spec(root, uri, "outcome_json", "launcher.array_parallelism=2")
    ok, bad = submit.submit(spec, [functools.partial(int, "3"), functools.partial(int, "x")])
    recs = [{"job_id": j, "launcher": "local", "folder": str(submit.submitit_folder(spec))} for j in (ok, bad)]
    t0 = time.time()
    while any(s.alive for s in job_states(recs, spec.sweep_dir).values()) and time.time() - t0 < 120:
        time.sleep(0.2)
    states = job_states(recs, spec.sweep_dir)
    assert states[ok].state == "DONE"
    assert states[bad].state == "FAILED" and "invalid literal for int()" in states[bad].detail
    for j in (ok, bad):
        assert json.loads(outcome.path_of(submit.submitit_folder(spec), j).read_text())["outcome"] in ("success",
                                                                                                      "error")


def test_an_outcome_file_that_is_not_one_is_unreadable_not_trusted(tmp_path):
    (tmp_path / "1_0_outcome.json").write_text('["success"]')
    (tmp_path / "2_0_outcome.json").symlink_to(tmp_path / "1_0_outcome.json")
    (tmp_path / "3_0_outcome.json").write_text('{"outcome": "success", "detail": ""}')
    assert outcome.read(tmp_path, "1")["outcome"] == "unreadable"
    assert outcome.read(tmp_path, "2")["outcome"] == "unreadable"  # a symlink is not followed
    assert outcome.read(tmp_path, "3") == {"outcome": "success", "detail": ""}
    assert outcome.read(tmp_path, "4") is None
