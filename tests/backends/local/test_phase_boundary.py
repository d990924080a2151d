"""A stop asked for mid-rollout is honoured between two decode steps (issue 45, "a signal waits out a whole phase"):
the engine asks the trainer's phase boundary before each decode step, so the step is abandoned within one decode
step instead of after the whole rollout. Abandoning is safe anywhere in a step: the run resumes from its last
checkpoint (run.py), and asking computes nothing (every curve bitwise unchanged: tests/test_golden.py)."""
import pytest
import torch

from harness.backends.local.trainer import LocalTrainer, StepAborted
from harness.spec import load

TINY = ["trainer.prompts_per_step=2", "trainer.group_size=2", "task.warmstart.max_steps=0"]


@pytest.mark.parametrize("task", ["sort", "lookup"])
def test_a_stop_during_the_rollout_is_honoured_within_one_decode_step(task, tmp_path, monkeypatch):
    from harness.backends.local import warmstart
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    trainer = LocalTrainer(load([*TINY, f"task={task}"]), torch.device("cpu"))
    advanced = []
    real = trainer.infer._advance
    monkeypatch.setattr(trainer.infer, "_advance", lambda *a, **k: advanced.append(1) or real(*a, **k))
    asked = []
    trainer.stop_check = lambda: asked.append(len(advanced)) or len(advanced) >= 3  # stop after 3 engine forwards
    with pytest.raises(StepAborted):
        trainer.step_seeds()
    assert len(advanced) == 3, "the rollout went on after the stop was asked for"
    assert asked[0] == 1  # asked from inside the rollout, after its prefill


def test_without_a_stop_the_boundary_changes_nothing(tmp_path, monkeypatch):
    from harness.backends.local import warmstart
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    a = LocalTrainer(load(TINY), torch.device("cpu"))
    b = LocalTrainer(load(TINY), torch.device("cpu"))
    b.stop_check = lambda: False
    for _ in range(2):
        x, y = a.step_seeds()[0], b.step_seeds()[0]
        keys = [k for k in x if not k.startswith(("time/", "tokens/per_s"))]  # wall-clock rates differ
        assert [_bits(x[k]) for k in keys] == [_bits(y[k]) for k in keys]


def _bits(v) -> str:
    return float(v).hex()  # NaN == NaN here, and every bit compared
