import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness import numerics

numerics.pin()  # before torch's first operator: the runs' pinned CPU numerics (harness/numerics.py)
import torch  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

# Tiny budgets for tests: a few seconds per run on one CPU thread.
TINY = [
    "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
    "diagnostics.noise_sequences=4",
]


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides for a tiny run logged to a throw-away sqlite store under tmp_path."""
    def make(*extra: str, steps: int = 6, name: str = "run") -> list[str]:
        return [*TINY, f"trainer.steps={steps}", f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
                "tracking.experiment=test", f"out_dir={tmp_path}/{name}", *extra]
    return make


def _load_device_guard():
    """tests/device_guard.py as the module ``device_guard`` (pytest runs with --import-mode=importlib)."""
    if "device_guard" not in sys.modules:
        spec = importlib.util.spec_from_file_location("device_guard", Path(__file__).parent / "device_guard.py")
        sys.modules["device_guard"] = mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return sys.modules["device_guard"]


_load_device_guard()  # (importable by name from here on: ``from device_guard import StrictDevice``)


@pytest.fixture
def strict_device():
    """The test runs under ``device_guard.StrictDevice``: a tensor factory called without ``device=`` from
    harness/estimators or harness/backends/verl fails (on a GPU it would make a CPU tensor beside CUDA ones)."""
    with _load_device_guard().StrictDevice() as mode:
        yield mode
