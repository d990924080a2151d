"""The MLflow store a run points at: checked first and fast, created safely, asked what is finished.

- :func:`check` runs before anything heavy (before the warm start). An ``http(s)`` store is asked
  ``GET <uri>/health`` with a ``timeout_s`` limit (default 5 s; MLflow's own client would retry for
  minutes), with the basic auth MLflow's client would send (``harness.uri``: userinfo or
  ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``); every message names the store by its redacted URI; an sqlite store's folder must exist, and a fresh database is created (tables, migrations)
  under a file lock ``<db>.lock``, so that several processes starting at once against a new file do not
  race (``table ... already exists``). Failure: :class:`~harness.tracking.TrackingError` (exit 1).
- "Finished" means finished **in this store**: a run of the experiment tagged ``spec_sig = <signature>``
  and ``seed = <seed>`` whose MLflow status is ``FINISHED`` (:func:`finished_run`). A ``summary.json`` in a
  run folder whose run is not in the store does not count.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.uri import redact

TIMEOUT_S = 5.0


def _tracking_error(uri: str, why: str):
    from harness.tracking import TrackingError

    return TrackingError(f"cannot reach the MLflow tracking store at {redact(uri)!r}: {why} (store: tracking.uri, "
                         f"else $MLFLOW_TRACKING_URI, else the project's mlruns.db)")


def sqlite_path(uri: str) -> Path | None:
    """The database file of an ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def check(uri: str, timeout_s: float = TIMEOUT_S) -> None:
    """Reachable (and, for a fresh sqlite file, created) within seconds, or TrackingError."""
    if uri.lower().startswith(("http://", "https://")):
        _check_http(uri, timeout_s)
        return
    db = sqlite_path(uri)
    if db is not None:
        if not db.parent.is_dir():
            raise _tracking_error(uri, f"the folder {db.parent} does not exist")
        try:
            with lock_for(db, timeout_s=max(60.0, timeout_s)):
                _touch_store(uri)
        except OSError as exc:  # the lock file: a symlink (ELOOP), not a regular file, not writable
            raise _tracking_error(uri, f"its lock file {db}.lock cannot be used ({exc.strerror or exc}): remove it "
                                       f"if no process is creating the store (`rm {db}.lock`)") from None
        return
    _touch_store(uri)


def _check_http(uri: str, timeout_s: float) -> None:
    """``GET <uri>/health`` answers 200 within ``timeout_s`` (:func:`harness.http_store.health`), else
    TrackingError naming only the redacted URI."""
    from harness.http_store import health

    why = health(uri, timeout_s)
    if why is not None:
        raise _tracking_error(uri, why)


def lock_for(db: Path, timeout_s: float = 60.0):
    """A cross-process lock beside the database file (``<db>.lock``): ``filelock`` opens it with ``O_NOFOLLOW`` and
    never truncates an existing file; anything there but a regular file of this user is refused (OSError)."""
    import errno
    import stat as st

    from filelock import FileLock

    path = Path(str(db) + ".lock")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and (not st.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1):
        raise OSError(errno.EPERM, "not a regular file of this user with one link")
    return FileLock(str(path), timeout=timeout_s)


def _touch_store(uri: str) -> None:
    """Open the store once: creates and migrates a new database (MLflow's INFO lines about it silenced)."""
    import logging

    db_log = logging.getLogger("mlflow.store.db.utils")
    level = db_log.level
    db_log.setLevel(logging.WARNING)
    try:
        from harness.tracking import client_for

        client_for(uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any store failure is one message
        raise _tracking_error(uri, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        db_log.setLevel(level)


def runs_of(client, experiment: str, signature: str | None = None, status: str | None = None) -> list[Any]:
    """Active runs of ``experiment`` (newest first), optionally with ``spec_sig = signature`` and this status."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    where = []
    if signature is not None:
        where.append(f"tags.spec_sig = '{signature}'")
    if status is not None:
        where.append(f"attributes.status = '{status}'")
    out, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], " and ".join(where), max_results=1000,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def truncated(run) -> bool:
    """A run the tuner pruned: ended FINISHED, but stopped before its last step (tag ``status=pruned``), so it is
    no result of its spec: not a finished run to the lookups below, and left out of analysis (``analysis.load``)."""
    return run.data.tags.get("status") == "pruned"


def finished_run(client, experiment: str, signature: str, seed: int, after_ms: int = 0):
    """The newest FINISHED, complete (not pruned) run of this signature and seed in the store (started at or
    after ``after_ms``)."""
    for run in runs_of(client, experiment, signature, "FINISHED"):
        if run.data.tags.get("seed") == str(seed) and run.info.start_time >= after_ms and not truncated(run):
            return run
    return None


def finished_signatures(uri: str, experiment: str, after_ms: int = 0) -> set[str]:
    """Signatures with a FINISHED, complete (not pruned) run in ``experiment`` of the store at ``uri`` (one
    query, for sweeps)."""
    from harness.tracking import client_for

    runs = runs_of(client_for(uri), experiment, status="FINISHED")
    return {r.data.tags["spec_sig"] for r in runs
            if "spec_sig" in r.data.tags and r.info.start_time >= after_ms and not truncated(r)}
