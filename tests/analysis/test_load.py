"""Loading experiments from a real (tmp) MLflow sqlite store."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis.load import AnalysisError, default_tracking_uri, history_series, load_experiment, project_root
from analysis.synthetic import SyntheticRun, curve, log_runs
from harness import metrics as M

from .conftest import T_DEMO


def test_default_uri_is_the_project_store():
    assert default_tracking_uri() == f"sqlite:///{project_root() / 'mlruns.db'}"
    assert (project_root() / "analysis" / "load.py").exists()


def test_demo_groups_seeds_histories_and_probes(store):
    exp = load_experiment("demo", store.uri)
    assert exp.labels == [
        "rollout", "recompute", "tis(C=2,sequence)", "tis(C=2,token)", "tis(C=8,sequence)", "tis(C=8,token)",
        "mean_n(n=1)", "mean_n(n=4)", "mean_n(n=16)",
    ]
    assert all(len(exp.group_runs(lab)) == 3 for lab in exp.labels)
    assert sorted(exp.runs.loc[exp.runs["label"] == "rollout", "seed"]) == [0, 1, 2]
    run = exp.runs["run_id"].iloc[0]
    reward = exp.series(M.REWARD_MEAN, run)
    assert list(reward.index) == list(range(T_DEMO))  # full history, not the UI's sampled ~320 points
    wide = exp.wide(M.REWARD_MEAN)
    assert wide.shape == (T_DEMO, len(exp.runs))
    assert set(exp.probes["model_kind"]) == {"moe", "dense"}
    moe = exp.probes[exp.probes["model_kind"] == "moe"].iloc[0]
    assert moe["probe/diff"] == pytest.approx(0.009) and moe["probe/var_train"] == pytest.approx(1e-7)
    # nan loss survives the round trip
    rec = exp.runs[(exp.runs["label"] == "recompute") & (exp.runs["seed"] == 0)]["run_id"].iloc[0]
    loss = exp.series(M.POLICY_LOSS, rec)
    assert np.isnan(loss.loc[100:]).all() and np.isfinite(loss.loc[:99]).all()
    assert not exp.notes


def test_unknown_experiment_lists_the_known_ones(store):
    with pytest.raises(AnalysisError) as err:
        load_experiment("no_such_experiment", store.uri)
    assert "demo" in str(err.value) and "single" in str(err.value)


def test_context_tags_split_groups(store):
    exp = load_experiment("models", store.uri)
    assert exp.labels == ["rollout[dense_tiny]", "rollout[moe_tiny]"]
    assert load_experiment("models", store.uri, filter_string="tags.model = 'moe_tiny'").labels == ["rollout"]


def test_missing_metrics_are_noted(store):
    exp = load_experiment("missing", store.uri)
    assert not exp.has_metric(M.MISMATCH_K3) and exp.has_metric(M.REWARD_MEAN)
    assert any("mismatch/k3" in n and "any run" in n for n in exp.notes)


def test_history_series_keeps_the_latest_value_of_a_step_and_maps_inf():
    hist = [Metric("k", 1.0, 10, 0), Metric("k", 2.0, 5, 1), Metric("k", 3.0, 20, 0), Metric("k", 1.7976931348623157e308, 30, 2)]
    s = history_series(hist)
    assert list(s.index) == [0, 1, 2] and s.loc[0] == 3.0 and s.loc[1] == 2.0 and math.isinf(s.loc[2])


def test_inf_loss_round_trip_and_skipped_runs(fresh_store):
    uri = fresh_store.uri
    run = SyntheticRun("recompute", 0, curve(30, seed=0))
    log_runs(uri, "x", [run])
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("x").experiment_id
    rid = client.search_runs([exp_id])[0].info.run_id
    client.log_batch(rid, metrics=[Metric(M.POLICY_LOSS, float("inf"), int(time.time() * 1000), 31)])
    client.create_run(exp_id, tags={"analysis_summary": "1"})  # skipped silently
    client.create_run(exp_id, tags={"something": "else"})  # no estimator tag: skipped with a note
    exp = load_experiment("x", uri)
    assert len(exp.runs) == 1
    assert math.isinf(exp.series(M.POLICY_LOSS, rid).loc[31])
    assert any("without an `estimator` tag" in n for n in exp.notes)


def test_bulk_and_per_run_paths_agree(store, monkeypatch):
    import analysis.load as L

    bulk = load_experiment("demo", store.uri)
    assert L._bulk_store(L.client_for(store.uri)) is not None  # the sqlite store takes the bulk path
    monkeypatch.setattr(L, "_bulk_store", lambda client: None)
    per_run = load_experiment("demo", store.uri)
    for metric, runs in bulk.histories.items():
        assert set(runs) == set(per_run.histories[metric])
        for run_id, s in runs.items():
            assert s.equals(per_run.histories[metric][run_id]), (metric, run_id)
