"""Tensor files the harness writes and reads back (run checkpoints, the warm-start cache): read without
running code, written atomically.

Why (issue 27, item 1): ``torch.load(weights_only=False)`` unpickles arbitrary objects, so a crafted
``checkpoint.pt`` in a run folder or a file in ``.cache/warmstart/`` ran any command it named, before any
identity check. :func:`load` reads with ``weights_only=True``: tensors, ``torch.Generator`` states (byte
tensors), dicts, lists, tuples, strings, numbers, None; a file naming anything else (a class, a function)
is refused with :class:`UnsafeFile` and nothing of it runs. What the harness stores is only that (an
overlap run's pending batch is stored as a plain dict, ``overlap.py``).

:func:`save` writes ``<path>.<pid>.tmp`` then renames it over ``path``: a reader sees the old file or the
new one, never half of one; on any failure (disk full, a write error) the temporary file is removed and
:class:`WriteFailed` names ``path`` and the cause.
"""
from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

_REFUSED = re.compile(r"Unsupported global: GLOBAL (\S+)")


class UnsafeFile(ValueError):
    """The file holds more than tensors and plain values: refused, nothing of it executed."""


class WriteFailed(OSError):
    """A tensor file could not be written (the temporary file is removed)."""


def load(path: str | Path, map_location: Any = "cpu") -> Any:
    """The file's content, loaded with ``weights_only=True`` (module docstring); :class:`UnsafeFile` when it
    names code or classes. Other failures (truncated, not a torch file) raise torch's own exception."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        named = _REFUSED.search(str(exc))
        if named is None and "Weights only load failed" not in str(exc):
            raise
        what = f"names {named.group(1).rstrip('.')}" if named else "holds objects other than tensors and plain values"
        raise UnsafeFile(f"refused: it {what}, which no file the harness writes holds (nothing of it ran)") from None


def save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically (module docstring); :class:`WriteFailed` naming ``path``."""
    import torch

    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, Exception):
            raise
        raise WriteFailed(f"cannot write {path}: {cause(exc)}") from None


def cause(exc: BaseException) -> str:
    """An exception in a few words for a one-line error: its OS reason, else its first line, else its type."""
    text = getattr(exc, "strerror", None) or (str(exc).splitlines() or [""])[0].strip()
    return text[:160] or type(exc).__name__
