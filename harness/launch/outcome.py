"""A job's outcome as a JSON sidecar: ``<submitit folder>/<job id>_<task>_outcome.json``.

Why (issue 45, wrong case 1): ``harness.status`` and ``sweep --wait`` read whether a job succeeded from
submitit's ``<job>_0_result.pkl``, and unpickling runs whatever the file names: anyone who could write the
sweep folder got code run by whoever looked at the sweep. Now every submitted task is wrapped in
:class:`Reported`, which writes ``{"outcome": "success" | "error", "detail": <the error's last line>}`` as
JSON next to submitit's files, and :func:`read` takes the outcome from there (JSON runs nothing; a file
that is not the expected object is "unreadable", never executed). A job without a sidecar (killed, or
submitted by an older version) is read as having no result: submitit's pickles are never loaded here.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any, Callable

from submitit.helpers import Checkpointable, DelayedSubmission

SUFFIX = "_outcome.json"
MAX_BYTES = 64 * 1024  # a sidecar is one short line; a larger file is not one of ours


def path_of(folder: str | Path, job_id: str, task_id: int = 0) -> Path:
    return Path(folder) / f"{job_id}_{task_id}{SUFFIX}"


class Reported(Checkpointable):
    """``task``, which also leaves its outcome as JSON for :func:`read` (module docstring). Requeues
    (``checkpoint``) stay wrapped."""

    def __init__(self, task: Callable[[], Any]):
        self.task = task

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self.task(*args, **kwargs)
        except Exception as exc:
            _write({"outcome": "error", "detail": traceback.format_exception_only(type(exc), exc)[-1].strip()})
            raise
        _write({"outcome": "success", "detail": ""})
        return result

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission | None:
        inner = getattr(self.task, "checkpoint", None)
        delayed = inner(*args, **kwargs) if inner is not None else DelayedSubmission(self.task, *args, **kwargs)
        if delayed is None:
            return None
        return DelayedSubmission(Reported(delayed.function), *delayed.args, **delayed.kwargs)


def _write(outcome: dict) -> None:
    """Into the running job's submitit folder (nothing outside a submitit job)."""
    import submitit

    try:
        env = submitit.JobEnvironment()
        target = path_of(env.paths.folder, env.job_id, env.global_rank)
    except RuntimeError:  # not inside a submitit job (a task called directly)
        return
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(outcome))
        tmp.replace(target)
    except OSError:
        tmp.unlink(missing_ok=True)


def read(folder: str | Path, job_id: str, task_id: int = 0) -> dict | None:
    """The job's outcome ``{"outcome", "detail"}``; None when it left none; ``{"outcome": "unreadable"}`` when
    the file is not a sidecar (never anything but parsed JSON). A symlink or non-regular file is not read."""
    p = path_of(folder, job_id, task_id)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return {"outcome": "unreadable", "detail": f"{p} cannot be read"}
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"outcome": "unreadable", "detail": f"{p} is not a regular file"}
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("outcome") not in ("success", "error"):
        return {"outcome": "unreadable", "detail": f"{p} is not a job outcome"}
    return {"outcome": data["outcome"], "detail": str(data.get("detail", ""))[:500]}
