"""Reading a metric's history back from MLflow: one reader for status, tune, the verl backfill and analysis.

A step logged more than once (a run resumed from a checkpoint re-logs nothing, but a backfill or a
manual re-log may) keeps its latest value by timestamp; the result is sorted by step.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple


class History(NamedTuple):
    steps: list[int]
    values: list[float]

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.steps, self.values))


def from_metrics(metrics: Iterable) -> History:
    """``MlflowClient.get_metric_history`` output (objects with step, timestamp, value) -> ``History``."""
    latest: dict[int, tuple[int, float]] = {}
    for m in metrics:
        ts = m.timestamp or 0
        if m.step not in latest or ts >= latest[m.step][0]:
            latest[m.step] = (ts, m.value)
    steps = sorted(latest)
    return History(steps, [latest[s][1] for s in steps])


def read(client, run_id: str, key: str) -> History:
    """The history of ``key`` in run ``run_id`` (empty when never logged)."""
    return from_metrics(client.get_metric_history(run_id, key))
