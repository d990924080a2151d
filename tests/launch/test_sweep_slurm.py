"""Sweeps on a real single-node Slurm cluster (slurm/start.sh): no mocked scheduler."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from harness.uri import ROOT
from harness.launch import status, sweep
from harness.launch.expand import validate
from harness.launch.jobs import JobsDB, job_states
from harness.launch.progress import mlflow_progress
from harness.launch.spec import load_spec
from harness.launch.sweep import submit_sweep
from launch_helpers import SWEEPS, job_logs, job_state, squeue_ids, wait_for, wait_sweep, where


@pytest.fixture(scope="module")
def four_runs(slurm_cluster, store):
    """tiny.yaml (2 estimators x 2 seeds) submitted to Slurm, resubmitted while running, waited for."""
    import io

    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=slurm", *where(root, uri, "slurm4")]
    spec = load_spec(args[0], args[1:])
    t0 = time.time()
    first = io.StringIO()
    submit_sweep(spec, out=first)
    submit_s = time.time() - t0
    ids_after_submit = squeue_ids()
    again = io.StringIO()
    submit_sweep(load_spec(args[0], args[1:]), out=again)  # while the array is pending/running
    ids_after_again = squeue_ids()
    wait_sweep(spec, timeout=240, cluster=slurm_cluster)
    total_s = time.time() - t0
    print(f"\n[slurm] 4-run sweep: submitted in {submit_s:.1f} s, all finished after {total_s:.1f} s")
    return {"args": args, "spec": spec, "uri": uri, "first": first.getvalue(), "again": again.getvalue(),
            "ids": (ids_after_submit, ids_after_again), "runs": validate(load_spec(args[0], args[1:]))}


def test_four_runs_complete_and_are_in_mlflow(four_runs):
    assert "4 to submit" in four_runs["first"] and "as slurm job" in four_runs["first"]
    spec, runs = four_runs["spec"], four_runs["runs"]
    db = JobsDB(spec.sweep_dir)
    job_ids = {db.runs[r.signature]["job_id"] for r in runs}
    assert len(job_ids) == 4 and len({j.split("_")[0] for j in job_ids}) == 1, "one job array of 4 tasks"
    states = job_states(db.runs.values(), spec.sweep_dir)
    assert {states[j].state for j in job_ids} == {"COMPLETED"}, job_logs(spec)

    client = MlflowClient(tracking_uri=four_runs["uri"])
    exp = client.get_experiment_by_name("slurm4")
    mruns = client.search_runs([exp.experiment_id])
    assert len(mruns) == 4
    by_sig = {m.data.tags["spec_sig"]: m for m in mruns}
    assert set(by_sig) == {r.signature for r in runs}
    for r in runs:
        m = by_sig[r.signature]
        tags = m.data.tags
        assert m.info.status == "FINISHED" and tags["status"] == "finished"
        assert tags["estimator"] == r.cfg.estimator.name and tags["seed"] == str(r.cfg.seed)
        assert tags["clip_c"] == ("2.0" if r.cfg.estimator.name == "tis" else "na")
        for key in ("n", "backend", "model", "task", "git_commit"):
            assert tags.get(key), key
        steps = [h.step for h in client.get_metric_history(m.info.run_id, "reward/mean")]
        assert sorted(steps) == list(range(8))
        assert json.loads((r.cfg.run_dir / "summary.json").read_text())["run_id"] == m.info.run_id


def test_resubmitting_submits_nothing(four_runs, capsys):
    # while the jobs were still queued or running: all left alone, no new job
    assert "0 to submit" in four_runs["again"], four_runs["again"]
    before, after = four_runs["ids"]
    assert after == before
    # after they finished: all skipped, no new job, jobs.json unchanged
    spec = four_runs["spec"]
    recorded = JobsDB(spec.sweep_dir).runs
    ids = squeue_ids()
    assert sweep.main(four_runs["args"]) == 0
    assert "0 to submit, 4 finished (skipped), 0 running" in capsys.readouterr().out
    assert squeue_ids() == ids
    assert JobsDB(spec.sweep_dir).runs == recorded


def test_status_table(four_runs, capsys):
    assert status.main(four_runs["args"]) == 0
    out = capsys.readouterr().out
    assert "run" in out and "signature" in out and "collapsed?" in out and "4 finished" in out
    assert status.main(four_runs["args"] + ["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["state"] == "finished" and row["step"] == 8 and row["job"] and row["collapsed"] is None
        assert 0 <= row["reward"] <= 1


def test_invalid_sweep_submits_nothing(slurm_cluster, store, tmp_path):
    root, uri = store
    spec_path = tmp_path / "bad.yaml"
    data = yaml.safe_load((SWEEPS / "tiny.yaml").read_text())
    data["base"] += ["estimator=tis"]
    data["grid"] = {"estimator.clip_c": [2.0, 3.0, 0.9]}
    spec_path.write_text(yaml.safe_dump(data))
    ids = squeue_ids()
    r = subprocess.run([sys.executable, "-m", "harness.sweep", str(spec_path), "launcher=slurm",
                        *where(root, uri, "bad")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "estimator.clip_c" in r.stderr and "run 5/6 (estimator.clip_c=0.9 seed=0)" in r.stderr, r.stderr
    assert "nothing submitted" in r.stderr
    assert squeue_ids() == ids
    assert not (root / "bad").exists()


PREEMPT = {
    "name": "preempt",
    "base": ["trainer.steps=100", "trainer.prompts_per_step=8", "trainer.group_size=8", "trainer.num_minibatches=2",
             "task.warmstart.max_steps=20"],
    "seeds": [3],
    "launcher": {"name": "slurm", "time_min": 60, "cpus_per_task": 1, "mem_gb": 2, "checkpoint_every": 5},
}
WALL_CLOCK = ("time/", "tokens/per_s", "summary/time_per_step_s")


def _step_pids(job_id: str) -> list[int]:
    """PIDs of the job's first step (the python that runs the callable), from `scontrol listpids`."""
    out = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()[1:]]
    pids = [int(r[0]) for r in rows if len(r) >= 3 and r[2] == "0"]
    assert pids, out
    return pids


def test_preempted_run_resumes_to_the_uninterrupted_curve(slurm_cluster, store, tmp_path):
    """Interrupted twice (scontrol requeue + the process killed; USR2 = submitit checkpoints and requeues),
    the run ends with exactly the curve of an uninterrupted run of the same spec and seed, in one
    MLflow run, every step logged once."""
    root, uri = store
    p = tmp_path / "preempt.yaml"
    p.write_text(yaml.safe_dump(PREEMPT))
    ref, pre = load_spec(p, where(root, uri, "pre_ref")), load_spec(p, where(root, uri, "pre_int"))
    t0 = time.time()
    submit_sweep(ref)
    submit_sweep(pre)
    run = validate(pre)[0]
    sig, run_dir = run.signature, run.cfg.run_dir
    job = JobsDB(pre.sweep_dir).runs[sig]["job_id"]

    def logged() -> int:
        prog = mlflow_progress(uri, "pre_int", [sig]).get(sig)
        return len(prog["steps"]) if prog else 0

    wait_for(lambda: logged() >= 17, 150, "17 logged steps", pre)  # checkpoints every 5: steps 15, 16 redone
    # a hard preemption: Slurm requeues the job and its process dies at once, between two checkpoints
    # (submitit ignores the SIGTERM of a requeue, so without the KILL it would run on for KillWait+)
    pids = _step_pids(job)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: job_state(job) == "PENDING", 60, "the job to be requeued", pre)
    n1 = logged()
    assert not (run_dir / "summary.json").exists() and n1 < 100, "the run finished before it was interrupted"

    wait_for(lambda: logged() >= n1 + 8, 150, "progress after the first resume", pre)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    wait_for(lambda: job_state(job) == "PENDING", 60, "the job to requeue itself after USR2", pre)
    n2 = logged()
    assert not (run_dir / "summary.json").exists() and n2 < 100, "the run finished before the second interruption"

    wait_sweep(ref, timeout=200, cluster=slurm_cluster)
    wait_sweep(pre, timeout=200, cluster=slurm_cluster)
    print(f"\n[slurm] preemption test: interrupted at {n1} and {n2} logged steps; done after {time.time() - t0:.0f} s")
    show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=2" in show, show
    log = "\n".join(p.read_text() for p in (pre.sweep_dir / "submitit").glob("*_log.out"))
    assert log.count("Starting with JobEnvironment") == 3 and "Calling checkpoint method" in log

    client = MlflowClient(tracking_uri=uri)
    (a,) = client.search_runs([client.get_experiment_by_name("pre_ref").experiment_id])
    (b,) = client.search_runs([client.get_experiment_by_name("pre_int").experiment_id])  # one MLflow run
    assert a.data.tags["spec_sig"] == b.data.tags["spec_sig"] == sig
    assert set(a.data.metrics) == set(b.data.metrics)
    compared = 0
    for key in sorted(a.data.metrics):
        hb = [(m.step, m.value) for m in client.get_metric_history(b.info.run_id, key)]
        steps = [s for s, _ in hb]
        assert len(steps) == len(set(steps)), f"{key}: a step logged twice"
        if key.startswith("summary/"):
            continue
        assert sorted(steps) == list(range(100)), f"{key}: steps missing"
        if key.startswith(WALL_CLOCK):
            continue
        ha = [(m.step, m.value) for m in client.get_metric_history(a.info.run_id, key)]
        assert sorted(ha) == sorted(hb), f"{key}: the resumed curve differs from the uninterrupted one"
        compared += 1
    assert compared >= 10
    sa = json.loads((ref.runs_dir / ref.experiment / sig / "summary.json").read_text())
    sb = json.loads((run_dir / "summary.json").read_text())
    assert (sa["final_reward"], sa["peak_reward"], sa["steps_done"]) == (sb["final_reward"], sb["peak_reward"], 100)
