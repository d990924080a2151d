"""``backend.deterministic`` (issue 41, item 4): a run asks torch for deterministic kernels and cuBLAS's reproducible
workspace before it computes, its fingerprint key says so on a GPU, and it is its own spec (never pooled with the
default's runs). On the CPU the mechanism is tested here, a resume included; a GPU's bits are measured on a GPU
(``benchmarks/gpu_pack_check.py --against again``, docs/speed.md)."""
import pytest
import torch

from mlflow.tracking import MlflowClient

from harness import metrics as M
from harness import numerics
from harness.run import execute
from harness.spec import load


def history(cfg, summary, key):
    client = MlflowClient(cfg.tracking.uri)
    return [(m.step, m.value) for m in sorted(client.get_metric_history(summary.run_id, key), key=lambda m: m.step)]


@pytest.fixture
def restore_mode(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    yield
    torch.use_deterministic_algorithms(False)


def test_a_deterministic_run_trains_with_deterministic_kernels_and_resumes_bitwise(tiny_overrides, restore_mode):
    import os

    seen = []

    def watch(step, values):
        seen.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        if step == 4 and len(seen) == 5:
            raise KeyboardInterrupt  # interrupted once, then resumed from the checkpoint of step 3
        return False

    cfg = load(tiny_overrides("backend.deterministic=true", "trainer.checkpoint_every=3", steps=8, name="det"))
    with pytest.raises(KeyboardInterrupt):
        execute(cfg, on_step=watch, progress=False)
    resumed = execute(cfg, on_step=watch, progress=False)
    assert set(seen) == {(True, numerics.CUBLAS_WORKSPACE)}
    torch.use_deterministic_algorithms(False)
    straight_cfg = load(tiny_overrides("backend.deterministic=true", "tracking.experiment=straight", steps=8,
                                       name="straight"))
    straight = execute(straight_cfg, progress=False)
    for key in (M.REWARD_MEAN, M.POLICY_LOSS):
        assert history(cfg, resumed, key) == history(straight_cfg, straight, key), key


def test_deterministic_is_its_own_spec_and_a_gpu_key_names_the_mode(monkeypatch, restore_mode):
    assert load(["backend.deterministic=true"]).signature != load([]).signature
    assert load(["backend.deterministic=false"]).signature == load([]).signature  # stored signatures unchanged
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    assert numerics.fingerprint("cuda")["key"].endswith("| Some GPU | nondeterministic")
    numerics.deterministic()
    assert numerics.fingerprint("cuda")["key"].endswith("| Some GPU | deterministic")
    assert "deterministic" not in numerics.fingerprint("cpu")["key"]  # the CPU's key (and its golden curves) unchanged


def test_a_pack_after_a_deterministic_one_in_the_same_process_runs_as_its_own_spec_says(tiny_overrides, restore_mode):
    """The mode is set for each pack: a job's next pack of a default spec does not inherit it."""
    execute(load(tiny_overrides("backend.deterministic=true", steps=2, name="det")), progress=False)
    seen = []
    execute(load(tiny_overrides("tracking.experiment=plain", steps=2, name="plain")),
            on_step=lambda step, values: seen.append(torch.are_deterministic_algorithms_enabled()) or False,
            progress=False)
    assert seen and not any(seen)
