"""The histories file checked before anything is read from it (issue 45): bounded in size, every run and field of
the right kind, each run once. A leaf module (standard library only).

On d747b32, of 30 edited files 12 gave tracebacks (a field of the wrong type, values and steps of unequal length,
duplicate steps, nesting 200,000 deep), 10 were read silently wrong (seed ``"abc"`` shown as -1, no experiment
name read as ``None``), two runs under one ``run_id`` were reported as two seeds of one curve (mixed up), and a
1.1 MB gzip bomb took 2.27 GB. Now :func:`decompress` stops past :func:`size_limit` and :func:`check` refuses a
malformed document with one line naming the run (its position and id) and the field: ``ValueError`` here,
:class:`analysis.load.AnalysisError` (exit 2) where it is read (:func:`analysis.histories.read`).
"""
from __future__ import annotations

import gzip
import io
import math
import numbers
from typing import Any

NON_FINITE = ("NaN", "Infinity", "-Infinity")
MIN_LIMIT = 64 * 2 ** 20  # bytes decompressed that any file may hold
RATIO = 40  # a histories file compresses ~3.5x (docs/results/*); a gzip bomb ~1000x
INT64 = 2 ** 63


class Malformed(ValueError):
    """One line: where in the file (run, field) and what is wrong."""


def size_limit(compressed: int) -> int:
    """The most bytes a file of ``compressed`` bytes may decompress to: ``max(64 MiB, 40 x compressed)``."""
    return max(MIN_LIMIT, RATIO * compressed)


def decompress(raw: bytes) -> bytes:
    """``raw`` gunzipped, read in chunks and stopped past :func:`size_limit` (:class:`Malformed`). OSError/EOFError
    for what is not gzip."""
    limit, out, total = size_limit(len(raw)), [], 0
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return b"".join(out)
            total += len(chunk)
            if total > limit:
                raise Malformed(f"it decompresses to more than {limit:,} bytes ({RATIO}x its size, or 64 MiB): "
                                "not a histories file")
            out.append(chunk)


def _is_number(v: Any) -> bool:
    return (isinstance(v, numbers.Real) and not isinstance(v, bool)) or v in NON_FINITE


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64


def _strings(value: Any, where: str) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Malformed(f"{where} must be an object of strings")


def check(doc: dict[str, Any]) -> None:
    """Every field :mod:`analysis.histories` reads, of the kind it reads; :class:`Malformed` at the first that is
    not (module docstring)."""
    exp = doc.get("experiment")
    if not isinstance(exp, dict) or not isinstance(exp.get("name"), str) or not exp["name"]:
        raise Malformed("experiment.name: missing or not a string")
    if not isinstance(exp.get("experiment_id", ""), (str, int)) or isinstance(exp.get("experiment_id"), bool):
        raise Malformed("experiment.experiment_id: not a string")
    if "tags" in exp:
        _strings(exp["tags"], "experiment.tags")
    metrics = doc.get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise Malformed("metrics: must be a list of names")
    if not isinstance(doc.get("complete", False), bool):
        raise Malformed("complete: must be true or false")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise Malformed("runs: must be a non-empty list")
    seen: dict[str, int] = {}
    for i, run in enumerate(runs, 1):
        if not isinstance(run, dict):
            raise Malformed(f"run {i}: not an object")
        rid = run.get("run_id")
        where = f"run {i} ({rid!r})" if isinstance(rid, str) else f"run {i}"
        if not isinstance(rid, str) or not rid:
            raise Malformed(f"{where}: run_id missing or not a string")
        if rid in seen:  # two runs under one id: read back, the second's curve was the first's too (mixed up)
            raise Malformed(f"{where}: run_id repeats run {seen[rid]}'s: each run must appear once")
        seen[rid] = i
        _run(run, where)


def _run(run: dict[str, Any], where: str) -> None:
    if not isinstance(run.get("run_name"), (str, type(None))):
        raise Malformed(f"{where}: run_name must be a string")
    if not isinstance(run.get("status"), str):
        raise Malformed(f"{where}: status missing or not a string")
    if run.get("start_time") is not None and not _is_int(run["start_time"]):
        raise Malformed(f"{where}: start_time must be an integer (ms) or null")
    for field in ("tags", "params"):
        _strings(run.get(field), f"{where}: {field}")
    seed = run["tags"].get("seed")
    if seed is not None and not seed.lstrip("-").isdigit():
        raise Malformed(f"{where}: tags.seed {seed!r} is not an integer")
    latest = run.get("latest")
    if not isinstance(latest, dict) or not all(isinstance(k, str) and _is_number(v) for k, v in latest.items()):
        raise Malformed(f"{where}: latest must be an object of numbers")
    hist = run.get("histories")
    if not isinstance(hist, dict):
        raise Malformed(f"{where}: histories must be an object")
    for metric, h in hist.items():
        at = f"{where}: histories[{metric!r}]"
        if not isinstance(h, dict) or not isinstance(h.get("step"), list) or not isinstance(h.get("value"), list):
            raise Malformed(f"{at} must hold the lists step and value")
        steps, values = h["step"], h["value"]
        if len(steps) != len(values):
            raise Malformed(f"{at}: {len(steps)} steps but {len(values)} values")
        if not all(_is_int(s) for s in steps):
            raise Malformed(f"{at}.step: not all integers")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise Malformed(f"{at}.step: not ascending, each step once")
        if not all(_is_number(v) for v in values):
            raise Malformed(f"{at}.value: not all numbers (or \"NaN\", \"Infinity\", \"-Infinity\")")
        if any(isinstance(v, float) and math.isnan(v) for v in values):  # JSON has no NaN literal; Python's reads it
            raise Malformed(f"{at}.value: a NaN literal (write \"NaN\")")
