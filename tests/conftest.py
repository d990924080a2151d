import os

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
