"""harness.tracking against a real sqlite MLflow store: step metrics are written in batches of whole
steps, so the store never holds half a step, and a flush leaves every step exactly once."""
from __future__ import annotations

from harness.tracking import StepBuffer, Tracker


def _steps(tracker: Tracker, key: str) -> list[int]:
    return sorted(m.step for m in tracker.client.get_metric_history(tracker.run_id, key))


def test_step_buffer_writes_whole_steps_in_batches_and_each_step_once(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", "buffer")
    keys = [f"k/{i}" for i in range(70)]  # about a local run's metrics per step
    buffer = StepBuffer(tracker)
    per_batch = StepBuffer.MAX // len(keys)  # 12 whole steps fit in one log_batch
    for step in range(per_batch + 3):
        buffer.add(step, {k: float(step) for k in keys})
    # the 13th step did not fit: the first 12 went out as one batch, all metrics of each step together
    for key in (keys[0], keys[-1]):
        assert _steps(tracker, key) == list(range(per_batch))
    assert tracker.last_logged_step(keys[0]) == per_batch - 1
    buffer.flush()
    buffer.flush()  # nothing left: no second copy
    for key in keys:
        assert _steps(tracker, key) == list(range(per_batch + 3))
    history = sorted(tracker.client.get_metric_history(tracker.run_id, "k/5"), key=lambda m: m.step)
    assert [m.value for m in history] == [float(s) for s in range(per_batch + 3)]
