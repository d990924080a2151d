"""launcher.seeds_per_job: the sweep launcher packs seeds of one spec into one job (a seed pack)."""
from __future__ import annotations

import json

from harness.launch import status, submit, sweep
from harness.launch.expand import validate
from harness.launch.jobs import JobsDB
from harness.launch.spec import SweepError, load_spec

from launch_helpers import SWEEPS, wait_sweep, where


def test_seed_packs_group_seeds_of_one_spec_only():
    spec = load_spec(str(SWEEPS / "tiny.yaml"), [])
    cfgs = [r.cfg for r in validate(spec)]  # 2 estimators x 2 seeds
    packs = submit.seed_packs(cfgs, 2)
    assert sorted(len(p) for p in packs) == [2, 2]
    for p in packs:
        assert len({cfgs[i].group_signature for i in p}) == 1 and len({cfgs[i].seed for i in p}) == 2
    assert submit.seed_packs(cfgs, 1) == [[i] for i in range(len(cfgs))]


def test_seeds_per_job_must_be_a_positive_integer():
    import pytest

    with pytest.raises(SweepError, match="launcher.seeds_per_job"):
        load_spec(str(SWEEPS / "tiny.yaml"), ["launcher.seeds_per_job=0"])


def test_a_packed_local_sweep_runs_each_seed_as_its_own_run(store, capsys):
    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[tis]", "launcher.seeds_per_job=2",
            *where(root, uri, "packed")]
    assert sweep.main(args) == 0
    assert "2 to submit" in capsys.readouterr().out
    spec = load_spec(args[0], args[1:])
    wait_sweep(spec, timeout=180)
    runs = JobsDB(spec.sweep_dir).runs
    assert len(runs) == 2 and len({r["job_id"] for r in runs.values()}) == 1  # one job for both seeds
    assert status.main(args + ["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["state"] for r in rows] == ["finished", "finished"]
    assert all(r["step"] == 8 and r["mlflow_run"] for r in rows) and rows[0]["mlflow_run"] != rows[1]["mlflow_run"]


def test_ablation20_is_every_estimator_times_twenty_seeds_in_packs_of_five():
    from harness.estimators import NAMES

    spec = load_spec(str(SWEEPS / "ablation20.yaml"), [])
    # every estimator registered when its runs were stored: gmpo_rs came later (issue 15), geo_rs and r2 (issue 31)
    assert sorted(spec.grid["estimator"]) == sorted(set(NAMES) - {"gmpo_rs", "geo_rs", "r2"})
    assert spec.seeds == list(range(20))
    assert spec.launcher.seeds_per_job == 5
