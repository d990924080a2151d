"""MLflow from inside verl: our tags, our metric names beside verl's, no step logged twice.

Runs verl's real ``Tracking`` class (verl/utils/tracking.py) against a throw-away sqlite store, with
our plugin's hook installed, on the config block translate.py writes.
"""
from __future__ import annotations

import pytest

from harness import metrics as M
from harness.backends.verl import translate
from harness.tags import run_tags
from harness.backends.verl.metrics import backfill, map_metrics, mapping

VERL_STEP = {  # names and shapes of one step of verl 0.9.1's metrics (v1 trainer)
    "critic/score/mean": 0.4, "actor/pg_loss": -0.01, "actor/grad_norm": 0.7, "actor/entropy": 1.3,
    "actor/pg_clipfrac": 0.02, "actor/ppo_kl": 1e-4, "rollout_corr/kl": 0.003, "rollout_corr/k3_kl": 0.0004,
    "rollout_corr/rollout_is_mean": 0.98, "rollout_corr/rollout_is_max": 1.9,
    "rollout_corr/rollout_is_eff_sample_size": 0.91, "rollout_corr/rollout_rs_masked_fraction": 0.05,
    "training/rollout_probs_diff_max": 0.3, "training/rollout_probs_diff_mean": 0.01, "timing_s/gen": 12.0,
    "timing_s/old_log_prob": 3.0, "timing_s/update_actor": 9.0, "timing_s/step": 30.0,
    "timing_per_token_ms/gen": 0.5, "training/global_step": 1,
}


def test_every_mapped_name_is_in_the_catalogue():
    from harness.estimators import NAMES

    for est in NAMES:
        for level in (None, "token", "sequence"):
            for dsts in mapping(est, level, exact_reward=True).values():
                assert set(dsts) <= set(M.CATALOGUE)


def test_map_metrics_per_estimator():
    mis = map_metrics(VERL_STEP, "mis", "sequence")
    assert mis[M.MISMATCH_K1] == mis[M.MISMATCH_REC_K1] == 0.003
    assert mis[M.IS_MASKED_FRAC] == 0.05 and mis[M.IS_ESS] == 0.91
    assert M.IS_WEIGHT_MAX not in mis  # verl's sequence-level max is the untruncated ratio
    assert map_metrics(VERL_STEP, "tis", "token")[M.IS_WEIGHT_MAX] == 1.9
    assert M.IS_WEIGHT_MAX not in map_metrics(VERL_STEP, "tis")  # level unknown (a backfill without it)
    assert map_metrics(VERL_STEP, "icepop")[M.IS_WEIGHT_MAX] == 1.9  # icepop's weight is token level
    assert mis[M.TOKENS_PER_S] == pytest.approx(2000.0) and mis[M.TIME_ROLLOUT] == 12.0
    assert M.REWARD_ACCURACY not in mis and map_metrics(VERL_STEP, "tis", "token", True)[M.REWARD_ACCURACY] == 0.4
    r3 = map_metrics(VERL_STEP, "r3")
    assert M.MISMATCH_K1 in r3 and M.MISMATCH_REC_K1 not in r3  # r3's recompute replays routing
    for bypass in ("rollout", "mean_n", "deterministic"):
        assert not any(k.startswith(("mismatch/", "is/")) for k in map_metrics(VERL_STEP, bypass))
    assert M.POLICY_CLIPFRAC not in mis and M.POLICY_APPROX_KL not in mis  # different definitions in verl


def _harness_block(spec, estimator: str, *extra: str):
    cfg = spec(f"estimator={estimator}", "model=qwen3_30b_a3b", *extra)
    return cfg, translate.verl_config(cfg, commit="abc123", check=False)


def test_verl_tracking_logs_our_tags_and_names_once(spec, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    from harness.backends.verl.plugins import tracking as hook

    hook.install()
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    cfg, vc = _harness_block(spec, "mis")
    config = OmegaConf.to_container(vc, resolve=False)

    t = Tracking(project_name="exp", experiment_name=translate.run_name(cfg), default_backend=["mlflow"], config=config)
    import mlflow

    run_id = mlflow.active_run().info.run_id
    t.log({**VERL_STEP, "training/global_step": 1}, step=1)
    t.log({**VERL_STEP, "training/global_step": 2}, step=2)
    t.finish()

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    want = run_tags(cfg, commit="abc123")
    assert set(M.RUN_TAGS) <= set(want) and {k: run.data.tags.get(k) for k in want} == want
    assert run.data.metrics[M.MISMATCH_K3] == 0.0004 and run.data.metrics["rollout_corr/k3_kl"] == 0.0004

    # a requeued job resumes the same MLflow run from an older checkpoint: step 2 again, then 3
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    t = Tracking(project_name="exp", experiment_name="ignored", default_backend=["mlflow"], config=config)
    t.log({**VERL_STEP, "training/global_step": 2, "critic/score/mean": 99.0}, step=2)
    t.log({**VERL_STEP, "training/global_step": 3}, step=3)
    t.finish()
    steps = sorted(m.step for m in client.get_metric_history(run_id, M.REWARD_MEAN))
    assert steps == [1, 2, 3]
    assert all(m.value != 99.0 for m in client.get_metric_history(run_id, "critic/score/mean"))


def test_plain_verl_runs_are_untouched(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from verl.utils.tracking import Tracking

    from harness.backends.verl.plugins import tracking as hook

    hook.install()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    import mlflow

    t = Tracking(project_name="plain", experiment_name="x", default_backend=["mlflow"], config={"trainer": {}})
    run_id = mlflow.active_run().info.run_id
    t.log(VERL_STEP, step=1)
    t.finish()
    keys = set(MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/m.db").get_run(run_id).data.metrics)
    assert M.REWARD_MEAN not in keys and "critic/score/mean" in keys


def test_backfill_adds_our_names_to_a_foreign_verl_run(tmp_path):
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/f.db"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("foreign")).info.run_id
    ts = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), ts, s) for s in (1, 2) for k, v in VERL_STEP.items()])
    n = backfill(uri, run_id, "tis", "token")
    assert n > 0 and backfill(uri, run_id, "tis", "token") == 0  # idempotent
    hist = client.get_metric_history(run_id, M.IS_WEIGHT_MEAN)
    assert sorted(m.step for m in hist) == [1, 2] and hist[0].value == 0.98
