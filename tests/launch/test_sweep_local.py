"""launcher=local: submitit's local executor on this machine, no Slurm."""
from __future__ import annotations

import json

from harness.launch import status, sweep
from harness.launch.sweep import JobsDB, load_spec

from launch_helpers import SWEEPS, wait_sweep, where


def test_local_sweep_runs_and_resubmits_nothing(store, capsys):
    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[recompute]", *where(root, uri, "local")]
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "2 to submit" in out and "as local job" in out
    spec = load_spec(args[0], args[1:])
    wait_sweep(spec, timeout=180)

    assert status.main(args + ["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["state"] for r in rows] == ["finished", "finished"]
    assert all(r["step"] == 8 and r["steps"] == 8 and r["mlflow_run"] for r in rows)

    before = JobsDB(spec.sweep_dir).runs
    assert sweep.main(args) == 0
    assert "0 to submit, 2 finished (skipped)" in capsys.readouterr().out
    assert JobsDB(spec.sweep_dir).runs == before
