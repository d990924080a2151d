"""The noise probe: training engine noiseless, inference engine noisy, router noise amplifies it."""
import math
import subprocess
import sys

from mlflow.tracking import MlflowClient

from harness.backends.local.probe import probe
from harness.spec import load


def test_probe_measures_noise_per_engine():
    moe = probe(load(["inference.router_noise_sigma=0"]), n=4, sequences=32)
    assert moe.var_train == 0.0 and moe.var_rollout > 0.0 and moe.diff > 0.0
    noisy = probe(load(["inference.router_noise_sigma=0.3"]), n=4, sequences=32)
    assert probe(load([]), n=4, sequences=32).var_rollout > noisy.var_rollout  # the default: sigma 1.0
    assert noisy.var_rollout > 10 * moe.var_rollout
    det = probe(load(["inference.deterministic=true"]), n=4, sequences=32)  # noise frozen, not removed
    assert det.var_rollout == 0.0 and det.diff > 0.0  # no noise, but still a train-inference mismatch


def test_probe_cli_logs_moe_and_dense_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/p.db"
    res = subprocess.run([sys.executable, "-m", "harness.probe", "--passes", "2", "--sequences", "8",
                          f"tracking.uri={uri}", "tracking.experiment=probe"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "| moe_tiny | moe |" in res.stdout and "| dense_tiny | dense |" in res.stdout
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("probe").experiment_id])
    assert sorted(r.data.tags["model_kind"] for r in runs) == ["dense", "moe"]
    assert all(r.data.tags["probe"] == "1" and "probe/var_rollout" in r.data.metrics for r in runs)


def test_probe_of_a_multi_turn_task_counts_the_policys_tokens_only():
    cfg = load(["task=lookup", "task.warmstart.max_steps=10"])
    res = probe(cfg, n=2, sequences=16)
    r = 3 * cfg.task.length + 2  # call + observation + answer slots
    assert 0 < res.tokens < 16 * (r - cfg.task.length)  # never the observation, nor PAD after a stop
    assert res.var_train == 0.0 and res.var_rollout > 0.0 and res.diff > 0.0


def test_probe_with_a_nucleus_leaves_out_tokens_a_pass_puts_outside_it():
    """processed mode with top-p: a re-scoring pass can give the sampled token probability 0 (log-prob -inf);
    such a token has no finite diff / variance and is left out (as mismatch/outside_support_frac's diagnostics),
    instead of turning diff into inf and var_rollout into nan."""
    res = probe(load(["inference.temperature=0.7", "inference.top_p=0.9"]), n=4, sequences=32)
    assert math.isfinite(res.diff) and math.isfinite(res.var_rollout) and res.var_rollout > 0.0
    assert 0 < res.tokens <= 32 * 5  # sort: 5 response tokens per sequence


def test_float16_inference_is_a_finer_engine_than_bfloat16():
    """The fp16 arm (``inference.dtype=float16``: an engine setting, a sweep variant, no estimator): the engine's
    kernels run in float16 (10 mantissa bits against bfloat16's 7), so without router noise both the train-inference
    diff and the rollout variance shrink (measured with 8 passes x 256 sequences: diff 4.3e-4 vs 4.2e-3, var_rollout
    1.8e-7 vs 3.5e-5 on moe_tiny)."""
    bf16 = probe(load(["inference.router_noise_sigma=0"]), n=4, sequences=32)
    fp16 = probe(load(["inference.router_noise_sigma=0", "inference.dtype=float16"]), n=4, sequences=32)
    assert fp16.var_train == 0.0 and 0.0 < fp16.var_rollout < bf16.var_rollout / 10
    assert 0.0 < fp16.diff < bf16.diff / 3
