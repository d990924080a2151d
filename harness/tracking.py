"""MLflow tracking of one run: tags, params, the resolved spec, step metrics in batches of whole steps.

Uses ``MlflowClient`` directly (no global active run). The default store is an embedded sqlite
database in the project folder; any tracking URI works (a server, another file). A resumed run
re-attaches to its MLflow run and never logs a step twice.

Every client the harness makes (:func:`client_for`) is a :class:`StoreClient`: each call that sqlite answers
"database is locked" (another process holds a write transaction past sqlite's own 20 s wait: an ``mlflow ui``
query, a ``sqlite3`` shell, a sweep's other jobs) is tried again, with exponential backoff, up to
``LOCK_DEADLINE_S``; then, and for any other failure of the store's database or files (a full disk, an I/O error,
a read-only file), it raises :class:`StoreError`: one line naming the store (its path, or its redacted URI) and
the fix, exit 1, no traceback. A retried call is safe: a locked transaction was rolled back, and a batch of
metrics sent again is deduplicated by MLflow (same key, step, value and timestamp).

An experiment the harness creates is tagged ``mlflow.experimentKind = custom_model_development`` (MLflow 3's
kind for training runs, :data:`EXPERIMENT_KIND`); a run is named for what it trains (:func:`run_name`,
``mean_n(n=8) s3``); an experiment deleted in the store is :class:`ExperimentDeleted` (exit 2, with the fix).
"""
from __future__ import annotations

import functools
import logging
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

#: how long a store call is retried while sqlite says "database is locked" (each try waits up to sqlite's own
#: busy timeout, 20 s in MLflow, before it fails)
LOCK_DEADLINE_S = 120.0
#: the first pause between two tries of a locked call; it doubles up to ``_MAX_PAUSE_S``
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.1, 5.0
#: MLflow 3's experiment kind for model training (the UI's "Model training" view, not the GenAI overview)
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


class TrackingError(RuntimeError):
    pass


class StoreError(TrackingError):
    """The store failed mid-run (locked past ``LOCK_DEADLINE_S``, disk full, a write error): one line, exit 1."""


class ExperimentDeleted(ConfigError):
    """``tracking.experiment`` names an experiment deleted in the store (exit 2: restore it or choose another)."""

    def __init__(self, name: str, experiment_id: str, uri: str, key: str = "tracking.experiment"):
        from harness.uri import redact

        self.name, self.experiment_id, self.uri = name, experiment_id, uri
        super().__init__(key, (
            f"MLflow experiment {name!r} was deleted in {redact(uri)}: restore it (`MLFLOW_TRACKING_URI={redact(uri)} "
            f"mlflow experiments restore --experiment-id {experiment_id}`) or choose another {key}"))


def _sqlite_error(exc: BaseException) -> str | None:
    """sqlite's own message ("database is locked", "database or disk is full", ...) if ``exc`` is, or was caused
    by, an ``sqlite3.OperationalError`` (MLflow wraps it in SQLAlchemy's, then in an ``MlflowException``)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, sqlite3.OperationalError):
            return str(e).splitlines()[0] if str(e) else type(e).__name__
        e = e.__cause__ or e.__context__
    return None


def _http_error(uri: str, exc: BaseException) -> str | None:
    """A short reason when ``exc`` is MLflow's client giving up on an http store (no answer, refused, timed out)."""
    if not uri.lower().startswith(("http://", "https://")):
        return None
    import re

    text = str(exc)
    if "API request to" not in text and "Max retries exceeded" not in text:
        return None
    m = re.search(r"\[Errno -?\d+\][^'\")\]]*|Read timed out|Max retries exceeded", text)
    return m.group(0).strip() if m else text.splitlines()[0][:200]


def _locked(reason: str | None) -> bool:
    return reason is not None and "is locked" in reason  # "database is locked", "database table is locked"


def _where(uri: str) -> str:
    """The store as a person finds it: an sqlite file's path, else its redacted URI."""
    from harness.uri import redact

    return uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else str(redact(uri))


def store_failure(uri: str, reason: str) -> StoreError:
    """One line naming the store and what to do."""
    where = _where(uri)
    again = "then run the same command again (it resumes from the run's last checkpoint)"
    if "disk is full" in reason:
        return StoreError(f"the MLflow store {where} cannot be written: {reason}; free space on its disk, {again}")
    return StoreError(f"the MLflow store {where} failed: {reason}; {again}")


class _QuietLockErrors(logging.Filter):
    """MLflow logs every SQLAlchemy OperationalError with its traceback before raising it; a StoreClient retries
    or reports those itself, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or _sqlite_error(exc) is None


_DB_LOG = logging.getLogger("mlflow.store.db.utils")
if not any(isinstance(f, _QuietLockErrors) for f in _DB_LOG.filters):
    _DB_LOG.addFilter(_QuietLockErrors())


def call_store(uri: str, fn, *args, deadline_s: float | None = None, **kwargs):
    """``fn(*args, **kwargs)``, tried again while sqlite says the store is locked, up to ``deadline_s``
    (default ``LOCK_DEADLINE_S``); a locked store past it, or another failure of the store's database or files:
    :class:`StoreError`. Other errors pass through unchanged."""
    deadline_s = LOCK_DEADLINE_S if deadline_s is None else deadline_s
    t0, pause, warned = time.monotonic(), _FIRST_PAUSE_S, False
    while True:
        try:
            return fn(*args, **kwargs)
        except TrackingError:
            raise
        except OSError as exc:  # an artifact (log_text) of a file store: disk full, read-only, gone
            where = exc.filename or _where(uri)
            raise StoreError(f"cannot write {where} (MLflow store {_where(uri)}): {exc.strerror or exc}; free space "
                             f"there or make it writable, then run the same command again (it resumes from the "
                             f"run's last checkpoint)") from None
        except Exception as exc:  # noqa: BLE001 - only sqlite's own failures and a dead http store are handled here
            http = _http_error(uri, exc)
            if http is not None:
                raise StoreError(f"the MLflow store {_where(uri)} did not answer ({http}, after "
                                 f"{time.monotonic() - t0:.0f} s of MLflow's retries); start it again, then run the "
                                 f"same command again (it resumes from the run's last checkpoint)") from None
            reason = _sqlite_error(exc)
            if reason is None:
                raise
            waited = time.monotonic() - t0
            if not _locked(reason):
                raise store_failure(uri, reason) from None
            if waited + pause > deadline_s:
                raise StoreError(
                    f"the MLflow store {_where(uri)} stayed locked for {waited:.0f} s (sqlite: {reason}; another "
                    f"process holds a write transaction on it: `fuser {_where(uri)}` names it); end it, then run the "
                    f"same command again (it resumes from the run's last checkpoint)") from None
            if not warned:
                print(f"warning: the MLflow store {_where(uri)} is locked by another process; retrying up to "
                      f"{deadline_s:.0f} s", file=sys.stderr, flush=True)
                warned = True
            time.sleep(pause)
            pause = min(2 * pause, _MAX_PAUSE_S)


class StoreClient:
    """An ``MlflowClient`` whose every public method goes through :func:`call_store` (retried while the sqlite
    store is locked; its failures one line). ``raw`` is the client itself, ``once(...)`` a call tried only once
    (a failing run's last word to a store that is itself the failure)."""

    def __init__(self, client, uri: str):
        self.raw, self.uri = client, uri

    def __getattr__(self, name: str):
        attr = getattr(self.raw, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            return call_store(self.uri, attr, *args, **kwargs)

        return call

    def once(self, name: str, *args, **kwargs):
        return call_store(self.uri, getattr(self.raw, name), *args, deadline_s=0.0, **kwargs)


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

    from harness.http_store import bound_http_retries, is_http

    given = uri
    if is_http(uri):
        bound_http_retries()  # MLflow's own retry settings, bounded (harness/http_store.py)
    uri = mlflow_uri(uri)
    mlflow.set_tracking_uri(uri)  # for artifact repositories; the client below is explicit
    return StoreClient(MlflowClient(tracking_uri=uri), given)


def live_experiment(client, name: str, uri: str):
    """The experiment ``name`` of the store (None if there is none); one deleted there is :class:`ExperimentDeleted`."""
    exp = client.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage == "deleted":
        raise ExperimentDeleted(name, exp.experiment_id, uri)
    return exp


def experiment_id(client, name: str, uri: str) -> str:
    """The id of the experiment ``name``, created if the store has none; either way of the kind
    :data:`EXPERIMENT_KIND` (an experiment of another kind is left as it is)."""
    exp = live_experiment(client, name, uri)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:  # made before the harness tagged its experiments
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_artifact_root(uri),
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except TrackingError:
        raise
    except Exception:  # created concurrently by another run of the sweep
        exp = live_experiment(client, name, uri)
        if exp is None:
            raise
        return exp.experiment_id


def run_name(cfg) -> str:
    """An MLflow run's name: ``tracking.run_name`` if set, else what it trains: the estimator's label (as analysis
    names its groups) and the seed, e.g. ``mean_n(n=8) s3``, ``tis(C=2,token) s0``."""
    from harness import estimators

    return cfg.tracking.run_name or f"{estimators.label(cfg.estimator.name, vars(cfg.estimator))} s{cfg.seed}"


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
        except (TrackingError, ConfigError):  # StoreError, ExperimentDeleted: their own line
            raise
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

    def finish(self, status: str = "FINISHED", once: bool = False) -> None:
        """End the MLflow run ``status``; ``once``: one try, not retried while the store is locked (a run that
        failed because of its store)."""
        if once:
            self.client.once("set_terminated", self.run_id, status=status)
        else:
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
        """Flush what the run computed before it failed, once (not retried: the store may be the failure; the steps
        after the last checkpoint are recomputed and logged when the run resumes), without hiding the failure
        behind a store error."""
        try:
            if self.rows:
                self.tracker.client.once("log_batch", self.tracker.run_id, metrics=self.rows)
                self.rows = []
        except Exception:  # noqa: BLE001 - the caller re-raises the original failure
            pass


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)

