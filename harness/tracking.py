"""MLflow tracking of one run: tags, params, the resolved spec, step metrics in batches of whole steps.

Uses ``MlflowClient`` directly (no global active run). The default store is an embedded sqlite
database in the project folder; any tracking URI works (a server, another file). A resumed run
re-attaches to its MLflow run and never logs a step twice.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any



class TrackingError(RuntimeError):
    pass


def _artifact_root(uri: str) -> str | None:
    """Artifacts of an sqlite store live next to its database file."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return None


def client_for(uri: str):
    """An MLflow client of the store at ``uri``, its credentials passed as MLflow's docs recommend
    (``harness.uri.mlflow_uri``: an http URI's userinfo in ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from harness.uri import mlflow_uri

    uri = mlflow_uri(uri)
    mlflow.set_tracking_uri(uri)  # for artifact repositories; the client below is explicit
    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_artifact_root(uri))
    except Exception:  # created concurrently by another run of the sweep
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


class Tracker:
    def __init__(self, uri: str, experiment: str, run_id: str | None = None,
                 run_name: str | None = None, tags: dict[str, str] | None = None):
        self.uri = uri
        try:
            self.client = client_for(uri)
            self.experiment_id = experiment_id(self.client, experiment, uri)
            if run_id is None:
                run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags or {})
                run_id = run.info.run_id
            else:
                self.client.update_run(run_id, status="RUNNING")
        except Exception as exc:  # noqa: BLE001
            from harness.uri import redact

            raise TrackingError(f"cannot reach the MLflow tracking store at {redact(uri)!r}: {exc}") from exc
        self.run_id = run_id

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_step(self, step: int, values: dict[str, float]) -> None:
        """All of a step's metrics in one call."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ts, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def last_logged_step(self, key: str) -> int:
        """Highest step logged for ``key`` (-1 if none): a resumed run logs only later steps."""
        hist = self.client.get_metric_history(self.run_id, key)
        return max((m.step for m in hist), default=-1)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class StepBuffer:
    """A run's step metrics, sent to MLflow in batches of whole steps, up to ``MAX`` metrics per
    ``log_batch`` (one store write per ~12 steps instead of one per step: measured in
    ``benchmarks/README.md``, logging). The training loops flush it before every checkpoint, when a
    run ends and on failure, so every step up to a checkpoint is in the store and a resumed run never
    misses nor repeats a step (the steps after the checkpoint are recomputed and logged then). A
    ``log_batch`` is one transaction of whole steps: ``last_logged_step`` never sees half a step."""

    MAX = 900  # MLflow accepts 1000 metrics per log_batch

    def __init__(self, tracker: "Tracker"):
        self.tracker, self.rows = tracker, []

    def add(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        new = [Metric(k, float(v), ts, step) for k, v in values.items()]
        if len(self.rows) + len(new) > self.MAX:
            self.flush()
        self.rows += new

    def flush(self) -> None:
        if self.rows:
            self.tracker.client.log_batch(self.tracker.run_id, metrics=self.rows)
            self.rows = []

    def flush_on_failure(self) -> None:
        """Flush what the run computed before it failed, without hiding the failure behind a store error."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - the caller re-raises the original failure
            pass


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)

