"""An Optuna study of TIS's C with trials as jobs on the real single-node Slurm cluster."""
from __future__ import annotations

import time

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from harness.launch.spec import load_spec
from harness.launch.tune import cli as tune
from harness.launch.tune.spec import parse_tune
from harness.launch.tune.study import open_storage
from launch_helpers import SWEEPS, where


def test_optuna_study_on_slurm_prunes_reports_and_continues(slurm_cluster, store, capsys):
    root, uri = store
    args = [str(SWEEPS / "tiny_tune.yaml"), "launcher=slurm", *where(root, uri, "tune")]
    t0 = time.time()
    assert tune.main(args) == 0
    first_s = time.time() - t0
    out = capsys.readouterr().out
    spec = load_spec(args[0], args[1:])
    tc = parse_tune(spec)
    study = optuna.load_study(study_name=tc.study, storage=open_storage(tc.storage))
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert len(trials) == 6 and TrialState.RUNNING not in states and TrialState.FAIL not in states, out
    assert states.count(TrialState.PRUNED) >= 1, out
    assert states.count(TrialState.COMPLETE) >= 1, out
    best_c = study.best_params["estimator.clip_c"]
    assert f"best: estimator.clip_c = {best_c:.4g}" in out
    assert "trial  state" in out  # the trials table
    for name in ("optimization_history.png", "slice.png"):
        assert (spec.sweep_dir / name).stat().st_size > 1000

    # each trial is one run: its own signature, its MLflow run tagged with the study and trial number
    client = MlflowClient(tracking_uri=uri)
    mruns = client.search_runs([client.get_experiment_by_name("tune").experiment_id])
    tagged = {(m.data.tags.get("optuna_study"), m.data.tags.get("optuna_trial")) for m in mruns}
    assert tagged == {("tiny_tune", str(t.number)) for t in trials}
    assert len({t.user_attrs["spec_sig"] for t in trials}) == 6
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert all(t.user_attrs["steps_done"] < 12 for t in pruned)

    # a second call adds trials to the same study instead of starting over
    t1 = time.time()
    assert tune.main(args + ["tune.n_trials=2"]) == 0
    second_s = time.time() - t1
    out2 = capsys.readouterr().out
    assert "6 trials so far; adding 2" in out2
    study = optuna.load_study(study_name=tc.study, storage=open_storage(tc.storage))
    assert len(study.get_trials()) == 8
    assert {t.number for t in trials} < {t.number for t in study.get_trials()}
    print(f"\n[slurm] Optuna: 6 trials in {first_s:.0f} s, 2 more in {second_s:.0f} s")

