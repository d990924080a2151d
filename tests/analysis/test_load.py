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


def test_default_uri_is_the_project_store(monkeypatch):
    # without $MLFLOW_TRACKING_URI (mlflow.set_tracking_uri, e.g. in an in-process tune, exports it)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
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


def _old_style_run(client, exp_id, seed: int, lr: str, status: str = "FINISHED", T: int = 40, tags: dict | None = None,
                   steps: int = 40):
    """A harness run as logged before the group_sig tag: estimator tags, the spec as params."""
    tags = {"estimator": "rollout", "n": "na", "clip_c": "na", "level": "na", "seed": str(seed), "model": "moe_tiny",
            "task": "sort", "backend": "local", **(tags or {})}
    run = client.create_run(exp_id, tags=tags)
    rid = run.info.run_id
    for k, v in {"estimator.name": "rollout", "trainer.lr": lr, "trainer.steps": str(steps), "seed": str(seed),
                 "tracking.uri": "sqlite:///x.db", "out_dir": f"/tmp/{seed}", "warmstart.steps": str(40 + seed)}.items():
        client.log_param(rid, k, v)
    ts = int(time.time() * 1000)
    client.log_batch(rid, metrics=[Metric(M.REWARD_MEAN, float(v), ts + i, i) for i, v in enumerate(curve(T, seed=seed))])
    if status != "RUNNING":
        client.set_terminated(rid, status=status)
    return rid


def test_runs_differing_only_in_lr_are_two_groups(fresh_store):
    """Old runs (no group_sig tag): the key comes from the logged params minus seed and output keys; the
    label names the param that tells the groups apart, and the groups table lists it."""
    client = MlflowClient(fresh_store.uri)
    exp_id = client.create_experiment("lr")
    for seed in (0, 1):
        _old_style_run(client, exp_id, seed, "0.0003")
        _old_style_run(client, exp_id, seed, "0.0001")
    exp = load_experiment("lr", fresh_store.uri)
    assert sorted(exp.labels) == ["rollout[trainer.lr=0.0001]", "rollout[trainer.lr=0.0003]"]
    assert all(sorted(exp.runs.loc[exp.runs.label == lab, "seed"]) == [0, 1] for lab in exp.labels)
    apart = dict(zip(exp.groups["label"], exp.groups["apart"]))
    assert apart["rollout[trainer.lr=0.0001]"] == "trainer.lr=0.0001"  # seed, out_dir, warmstart.* are not identity
    # --group-by accepts a param, not only a tag
    exp = load_experiment("lr", fresh_store.uri, group_by=["trainer.lr"])
    assert sorted(exp.labels) == ["rollout[0.0001]", "rollout[0.0003]"] and "trainer.lr" in exp.runs


def test_group_sig_tag_wins_and_splits_groups_tags_cannot(fresh_store):
    client = MlflowClient(fresh_store.uri)
    exp_id = client.create_experiment("sig")
    for seed in (0, 1):
        _old_style_run(client, exp_id, seed, "0.0003", tags={"group_sig": "aaaa"})
        _old_style_run(client, exp_id, seed, "0.0003", tags={"group_sig": "bbbb"})  # same params, other identity
    exp = load_experiment("sig", fresh_store.uri)
    assert len(exp.labels) == 2 and set(exp.runs["group_key"]) == {"aaaa", "bbbb"}
    assert sorted(exp.labels) == ["rollout[group=aaaa]", "rollout[group=bbbb]"]


def test_orphan_and_superseded_runs_are_left_out_and_listed(fresh_store):
    """A killed job's RUNNING orphan, a KILLED run and an older FINISHED run of the same spec and seed are
    not pooled with the finished rerun as extra seeds (the reliability review's F9)."""
    client = MlflowClient(fresh_store.uri)
    exp_id = client.create_experiment("orphans")
    orphan = _old_style_run(client, exp_id, 0, "0.0003", status="RUNNING", T=15)
    killed = _old_style_run(client, exp_id, 0, "0.0003", status="KILLED", T=12)
    old = _old_style_run(client, exp_id, 1, "0.0003")
    time.sleep(0.01)
    rerun0 = _old_style_run(client, exp_id, 0, "0.0003")
    rerun1 = _old_style_run(client, exp_id, 1, "0.0003")
    exp = load_experiment("orphans", fresh_store.uri)
    assert sorted(exp.runs["run_id"]) == sorted([rerun0, rerun1]) and exp.labels == ["rollout"]
    why = dict(zip(exp.excluded["run_id"], exp.excluded["why"]))
    assert why[orphan] == "status RUNNING" and why[killed] == "status KILLED" and "superseded" in why[old]
    assert any("3 run(s) left out" in n and orphan[:8] in n for n in exp.notes)
    kept = load_experiment("orphans", fresh_store.uri, include_unfinished=True)
    assert len(kept.runs) == 2 and len(kept.excluded) == 3  # the latest run of each seed still wins


def test_a_pruned_trial_is_not_a_seed(fresh_store):
    """A trial the tuner pruned ends FINISHED with the tag status=pruned after a few steps: its last reward is no
    final reward and its curve no collapse-free run, so it is left out (and listed), like an unfinished run."""
    client = MlflowClient(fresh_store.uri)
    exp_id = client.create_experiment("tune")
    full = [_old_style_run(client, exp_id, seed, "0.0003", tags={"status": "finished"}) for seed in (0, 1)]
    pruned = _old_style_run(client, exp_id, 2, "0.0003", T=12, tags={"status": "pruned"})
    exp = load_experiment("tune", fresh_store.uri)
    assert sorted(exp.runs["run_id"]) == sorted(full)
    assert dict(zip(exp.excluded["run_id"], exp.excluded["why"])) == {pruned: "pruned by the tuner (a truncated run)"}
    assert any("1 run(s) left out" in n and pruned[:8] in n for n in exp.notes)
    assert len(load_experiment("tune", fresh_store.uri, include_unfinished=True).runs) == 3
