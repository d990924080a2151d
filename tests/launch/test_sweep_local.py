"""launcher=local: submitit's local executor on this machine, no Slurm."""
from __future__ import annotations

import json

from harness.launch import status, sweep
from harness.launch.expand import build_run, validate
from harness.launch.jobs import JobsDB
from harness.launch.progress import prepare_tracking
from harness.launch.spec import load_spec

from launch_helpers import SWEEPS, wait_sweep, where


def test_local_sweep_runs_and_resubmits_nothing(store, capsys, tmp_path):
    """... also in a new store that holds only the runs restored from their archived parts (analysis/archive.py:
    a study that outlives its store)."""
    from analysis.archive import archive, restore
    from harness.tracking import client_for

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
    assert status.main(args + ["--json", "--blind"]) == 0  # a pre-registered study watched: no outcome shown
    blind = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["state"] for r in blind] == ["finished", "finished"] and [r["step"] for r in blind] == [8, 8]
    assert not any("reward" in r or "collapsed" in r for r in blind)
    assert status.main(args + ["--blind"]) == 0
    table = capsys.readouterr().out
    assert "8/8" in table and "final reward" not in table and "collapsed?" not in table

    before = JobsDB(spec.sweep_dir).runs
    assert sweep.main(args) == 0
    assert "0 to submit, 2 finished (skipped)" in capsys.readouterr().out
    assert JobsDB(spec.sweep_dir).runs == before

    assert archive("local", tmp_path / "parts", ["reward/mean"], uri).runs == 2
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    client_for(fresh).search_experiments()
    assert restore(tmp_path / "parts", fresh).written == 2
    moved = [a for a in args if not a.startswith(("tracking_uri=", "runs_dir="))]
    assert sweep.main(moved + [f"tracking_uri={fresh}", f"runs_dir={tmp_path / 'runs'}"]) == 0
    assert "0 to submit, 2 finished (skipped)" in capsys.readouterr().out


def test_rerun_forces_a_finished_run_from_scratch(store, capsys):
    """--rerun resubmits a finished run (the old summary kept aside) into a new MLflow run."""
    from mlflow.tracking import MlflowClient

    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[recompute]", "seeds=[0]",
            *where(root, uri, "rerun")]
    spec = load_spec(args[0], args[1:])
    assert sweep.main(args) == 0
    wait_sweep(spec, timeout=180)
    (run,) = validate(spec)
    first = json.loads((run.cfg.run_dir / "summary.json").read_text())
    # --wait blocks until the new run is FINISHED: the FINISHED run it supersedes does not count
    assert sweep.main(args + ["--rerun", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "1 to submit" in out
    assert "finished" in out.splitlines()[-1]
    assert (run.cfg.run_dir / "summary.json").exists()  # written before the store's FINISHED: the wait saw it
    assert list(run.cfg.run_dir.glob("summary.json.prev-*"))
    wait_sweep(spec, timeout=180)
    second = json.loads((run.cfg.run_dir / "summary.json").read_text())
    assert second["run_id"] != first["run_id"] and second["status"] == "finished"
    assert second["final_reward"] == first["final_reward"]  # same spec and seed: the same curve
    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("rerun").experiment_id])) == 2


def test_requeued_trial_job_takes_back_its_trial(store):
    """A trial job killed after it asked for its trial (then requeued) continues that same trial:
    same parameters, no second trial, no RUNNING left behind."""
    import optuna
    from optuna.trial import TrialState

    from harness.launch.tune.spec import parse_tune, store_of, validate_tune
    from harness.launch.tune.study import open_storage, open_study
    from harness.launch.tune.trial import TrialJob

    root, uri = store
    spec = load_spec(SWEEPS / "tiny_tune.yaml", where(root, uri, "requeued_trial"))
    tc = parse_tune(spec)
    study = open_study(spec, tc, validate_tune(spec, tc), store_of(spec, tc))
    prepare_tracking(spec, build_run(spec, spec.base))
    # what the first incarnation of slot 0 did before it was killed
    t = study.ask()
    t.set_user_attr("slot", 0)
    c = t.suggest_float("estimator.clip_c", 1.01, 10.0, log=True)
    result = TrialJob(spec, tc, slot=0)()  # the requeued job (in this process)
    trials = optuna.load_study(study_name=tc.study, storage=open_storage(tc.storage)).get_trials()
    assert len(trials) == 1 and trials[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert trials[0].params["estimator.clip_c"] == c and result["trial"] == 0
    assert TrialJob(spec, tc, slot=0)()["state"] == trials[0].state.name  # a third start: nothing to do


def test_the_heartbeat_says_done_running_queued_and_elapsed():
    from harness.launch.jobs import JobState
    from harness.launch.sweep import heartbeat

    states = {"1": JobState("RUNNING", True), "2": JobState("PENDING", True), "3": JobState("DONE", False)}
    assert heartbeat(10, 7, states, 90.0) == "[3/10] waiting: 3 done, 1 job(s) running, 1 queued (1.5 min)"


def test_a_second_submission_of_a_sweep_in_progress_is_refused(store, capsys):
    """Two submissions of one sweep at once would both plan its runs as not submitted (issue 27 item 2): while one
    holds the sweep folder's submit.lock, the other exits 2 naming it and writes no job; once released, it submits."""
    from harness.runlock import RunLock

    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[recompute]", "seeds=[0]",
            *where(root, uri, "twice")]
    spec = load_spec(args[0], args[1:])
    spec.sweep_dir.mkdir(parents=True, exist_ok=True)
    held = RunLock(spec.sweep_dir, "submit.lock", "is submitting the sweep in")
    held.acquire()
    try:
        assert sweep.main(args) == 2
        err = capsys.readouterr().err
        assert "submission in progress (pid" in err and "run it again" in err and "Traceback" not in err
        assert not JobsDB(spec.sweep_dir).runs
    finally:
        held.release()
    assert sweep.main(args) == 0
    assert "1 to submit" in capsys.readouterr().out
    wait_sweep(spec, timeout=180)


def test_the_waiter_looks_less_often_while_nothing_happens_and_at_once_after_news():
    """--wait's look at the store (every FINISHED run of the experiment) backs off 1.25x per quiet look to at most
    max_poll_s, and goes back to poll_s when a run finished or failed."""
    from harness.launch.sweep import next_poll

    delays, d = [], 5.0
    for _ in range(30):
        delays.append(d)
        d = next_poll(d, False, 5.0, 60.0)
    assert delays[:3] == [5.0, 6.25, 7.8125] and max(delays) == 60.0 and delays[-1] == 60.0
    assert all(b >= a for a, b in zip(delays, delays[1:]))
    assert sum(delays[:20]) < 20 * 60 and len([x for x in delays if x < 60]) == 12  # 12 looks before the cap
    assert next_poll(60.0, True, 5.0, 60.0) == 5.0


def test_ctrl_c_on_a_waiting_sweep_prints_one_line(store, tmp_path):
    """Issue 45: Ctrl-C (SIGINT to the terminal's process group) on ``sweep --wait`` printed the sweep's one line
    plus submitit's local controller's KeyboardInterrupt traceback (it shares the console); the controller's
    output now goes to ``<sweep>/submitit/local_controller.log``."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from harness.uri import ROOT

    root, uri = store
    args = [str(SWEEPS / "tiny.yaml"), "launcher=local", "grid.estimator=[recompute]", "seeds=[0]", "trainer.steps=400",
            *where(root, uri, "ctrl_c"), "--wait"]
    proc = subprocess.Popen([sys.executable, "-m", "harness.sweep", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        assert "submitted 1 runs" in proc.stdout.readline() + proc.stdout.readline()
        time.sleep(4)  # the worker is up and training
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert err.strip().startswith("sweep tiny: stopped waiting (Ctrl-C)") and len(err.strip().splitlines()) == 1, err
    for _ in range(120):  # the workers (same process group) end too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)


def test_blind_status_is_refused_for_a_tune_spec(capsys):
    """A tune spec's status is its trials' objective values: --blind cannot hide them, so it is refused (exit 2)."""
    assert status.main([str(SWEEPS / "tiny_tune.yaml"), "--blind"]) == 2
    assert "--blind" in capsys.readouterr().err
