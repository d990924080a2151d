"""Histories that travel: one experiment's runs and full per-step histories in one compressed file, and the
:class:`analysis.load.Experiment` read back from it with no MLflow store.

``python -m analysis export --experiment E --out FILE.json.gz`` writes the file (:func:`export`);
``python -m analysis report --from FILE.json.gz`` (and ``compare``, ``dose``) reads it (:func:`load`). Both
paths end in :func:`analysis.load.assemble`, the same selection, grouping, labels and notes as the store's
path, so the report's tables from the file are byte for byte those from the store.

**Format** (version 1): a gzip-compressed UTF-8 JSON document (standard JSON: no NaN literals), one run per
line once decompressed (``zcat FILE | head``)::

    {"format": "moe-rl-harness histories", "version": 1,
     "experiment": {"name": "ablation", "experiment_id": "3", "tracking_uri": "sqlite:///<local>/mlruns.db",
                    "tags": {"primary_contrasts": "{...}", ...}},   # the experiment's tags (absent: none known)
     "metrics": ["is/ess", "mismatch/k3", ...],   # the metrics whose histories the file holds, sorted
     "complete": true,                             # true: every metric any run logged is in "metrics"
     "runs": [
    {"run_id": "...", "run_name": "rollout-s0", "status": "FINISHED", "start_time": 1714000000000,
     "tags": {"estimator": "rollout", "group_sig": "...", "seed": "0", ...},   # every tag, as strings
     "params": {"trainer.lr": "0.0003", ...},                                 # every param (the spec)
     "latest": {"reward/mean": 0.81, ...},         # MLflow's latest value of each metric (probe runs use these)
     "histories": {"reward/mean": {"step": [0, 1, ...], "value": [0.21, 0.23, ...]}, ...}},
    ...
    ]}

- ``runs``: every active run of the experiment, in the store's search order, whatever its status or kind
  (FINISHED, RUNNING, KILLED, FAILED; training, probe, summary and foreign runs), so that reading the file
  leaves out the same runs for the same reasons as reading the store, and ``--include-unfinished`` and
  ``--group-by`` (any tag or param) work on it.
- Nothing secret or local: the header's ``tracking_uri``, every tag and every param are written through
  :func:`analysis.shareable.shareable` (no userinfo or password-like query value; an absolute local path keeps its
  last component only, ``<local>/<name>``): the file is meant to be committed.
- ``experiment.tags``: every tag of the MLflow experiment, as strings. The declared primary contrasts (tag
  ``primary_contrasts``, :mod:`harness.launch.primary`) travel with the runs, so a report from the file tests the
  same primary family, with the same "pre-registered" label, as the store's. A file written before the key existed
  reads as an experiment with no tags.
- ``histories``: per metric, the steps (integers, ascending, each once: a step logged twice keeps its latest
  value) and the values (float64) exactly as :func:`analysis.load.history_series` returns them (MLflow's stored
  +-1.797e308 already mapped back to +-inf). A metric the run never logged is absent.
- Floats are written by Python's ``repr`` (shortest string that reads back to the same double: exact round
  trip); NaN, +inf and -inf, which JSON lacks, are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
- ``complete`` is false when the file was written with a chosen list of metrics; reading a metric outside it
  is then refused (it would look like a metric no run logged).

A file of another ``format`` or ``version``, one that decompresses past a bound, or one with a field of the wrong
kind or a run twice (:mod:`analysis.histories_schema`) is refused with one line (:class:`analysis.load.AnalysisError`,
exit 2). The gzip header carries no name and no time, so exporting the same store twice writes the same bytes.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.uri import redact

from .load import (AnalysisError, Experiment, RunRecord, _load_histories, assemble, default_metrics,
                   default_tracking_uri, load_experiment, store_records, warn)
from . import histories_schema as schema
from .shareable import shareable, shareable_map

FORMAT = "moe-rl-harness histories"
VERSION = 1
SUFFIX = ".json.gz"
URI_PREFIX = "histories:"  # Experiment.tracking_uri of a file: no MLflow client accepts it
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
PART = re.compile(r"^part-(\d{3,})\.json\.gz$")  # a part of a folder of archived runs (analysis.archive)


@dataclass(frozen=True)
class Exported:
    """What :func:`export` wrote."""

    path: Path
    runs: int
    metrics: int
    values: int
    size: int  # bytes on disk


def _encode_value(v: float) -> float | str:
    v = float(v)
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _encode_values(values: np.ndarray) -> list:
    values = np.asarray(values, dtype=float)
    if np.isfinite(values).all():
        return values.tolist()
    return [_encode_value(v) for v in values.tolist()]


def _decode_values(values: Sequence) -> np.ndarray:
    return np.array([NON_FINITE[v] if isinstance(v, str) else v for v in values], dtype=float)


def _run_json(record: RunRecord, histories: dict[str, dict[str, pd.Series]]) -> dict[str, Any]:
    hist = {}
    for metric, runs in histories.items():
        s = runs.get(record.run_id)
        if s is not None and len(s):
            hist[metric] = {"step": s.index.to_numpy(np.int64).tolist(), "value": _encode_values(s.to_numpy())}
    return {"run_id": record.run_id, "run_name": record.run_name, "status": record.status,
            "start_time": record.start_time, "tags": shareable_map(record.tags), "params": shareable_map(record.params),
            "latest": {k: _encode_value(v) for k, v in record.latest.items()}, "histories": hist}


def encode(head: dict[str, Any], runs: Sequence[dict[str, Any]]) -> bytes:
    """The file's bytes: ``head`` and one run per line, gzip-compressed with no name and no time in its header."""
    lines = [json.dumps(run, allow_nan=False) for run in runs]
    text = json.dumps(head, allow_nan=False)[:-1] + ', "runs": [\n' + ",\n".join(lines) + "\n]}\n"
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=6, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


def made_shareable(doc: dict[str, Any]) -> dict[str, Any]:
    """A histories document (:func:`read`) as :func:`export` writes it now: its header URI, experiment tags, run
    tags and params through :func:`analysis.shareable.shareable` (files written before issue 45)."""
    head = {k: v for k, v in doc.items() if k != "runs"}
    exp = dict(head.get("experiment") or {})
    if "tracking_uri" in exp:
        exp["tracking_uri"] = shareable(str(exp["tracking_uri"]))
    if isinstance(exp.get("tags"), dict):
        exp["tags"] = shareable_map(exp["tags"])
    head["experiment"] = exp
    runs = [{**run, "tags": shareable_map(run["tags"]), "params": shareable_map(run["params"])} for run in doc["runs"]]
    return {**head, "runs": runs}


def export(name: str, tracking_uri: str | None = None, path: str | Path = "", metrics: Sequence[str] | None = None,
           threads: int = 4) -> Exported:
    """Write experiment ``name`` of ``tracking_uri`` to ``path`` (ending in ``.json.gz``): every run, and the
    full histories of ``metrics`` (default: every metric any run logged; a chosen name no run logged is kept, with a
    warning on stderr). Raises :class:`AnalysisError`."""
    path = Path(path)
    if not path.name.endswith(SUFFIX):
        raise AnalysisError(f"--out must be a file ending in {SUFFIX} (gzip-compressed JSON), got {str(path)!r}")
    tracking_uri = tracking_uri or default_tracking_uri()
    client, exp, records = store_records(name, tracking_uri)
    if not records:
        raise AnalysisError(f"experiment {name!r} in {redact(tracking_uri)} holds no runs to export")
    logged = sorted({m for r in records for m in r.latest})
    chosen = logged if metrics is None else sorted(dict.fromkeys(metrics))
    never = [m for m in chosen if m not in set(logged)]
    if never:  # a typo, or a metric these runs do not log (perturb/level: KL-held runs only): empty histories
        warn(f"export {name!r}: no run logged {', '.join(never)}: the file holds no values of "
             f"{'it' if len(never) == 1 else 'them'}")
    histories = _load_histories(client, [r.run_id for r in records], tuple(chosen), threads)
    head = {"format": FORMAT, "version": VERSION,
            "experiment": {"name": name, "experiment_id": exp.experiment_id, "tracking_uri": shareable(tracking_uri),
                           "tags": {str(k): shareable(str(v)) for k, v in sorted((exp.tags or {}).items())}},
            "metrics": chosen, "complete": set(logged) <= set(chosen)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(encode(head, [_run_json(r, histories) for r in records]))
        os.replace(tmp, path)
    except BaseException:  # a full disk, --out a folder: no .tmp left behind (the caller says why in one line)
        tmp.unlink(missing_ok=True)
        raise
    values = sum(len(s) for runs in histories.values() for s in runs.values())
    return Exported(path, len(records), len(chosen), values, path.stat().st_size)


def read(path: str | Path) -> dict[str, Any]:
    """The decoded document of a histories file, its format and version checked. Raises :class:`AnalysisError`."""
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"--from {str(path)!r}: no such file (write one with `python -m analysis export`)")
    try:
        doc = json.loads(schema.decompress(path.read_bytes()).decode("utf-8"))
    except schema.Malformed as exc:
        raise AnalysisError(f"--from {str(path)!r}: {exc}") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AnalysisError(f"--from {str(path)!r} is not a gzip-compressed JSON histories file "
                            f"({type(exc).__name__}): write one with `python -m analysis export`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise AnalysisError(f"--from {str(path)!r} is not a histories file (no \"format\": \"{FORMAT}\"): "
                            "write one with `python -m analysis export`")
    if doc.get("version") != VERSION:
        raise AnalysisError(f"--from {str(path)!r} is histories format version {doc.get('version')!r}; this analysis "
                            f"reads version {VERSION}: export it again with `python -m analysis export`")
    try:
        schema.check(doc)
    except schema.Malformed as exc:
        raise AnalysisError(f"--from {str(path)!r}: {exc}; export it again with `python -m analysis export`") from None
    return doc


def parts(folder: str | Path) -> list[Path]:
    """The archived parts of ``folder`` (:mod:`analysis.archive`), in the order they were written."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := PART.match(p.name))]
    return [p for _, p in sorted(found)]


def identity(tags: dict) -> tuple[str, str] | None:
    """A run's ``(spec_sig, seed)`` tags, the key by which the launcher asks a store whether it is finished; None for
    a run without them (not a harness training run)."""
    sig, seed = tags.get("spec_sig"), tags.get("seed")
    return (str(sig), str(seed)) if sig and seed is not None else None


def read_source(path: str | Path) -> dict[str, Any]:
    """:func:`read` of a file, or of a folder of archived parts (:mod:`analysis.archive`): their runs in one
    document, under the first part's header, with the metrics every part holds. Raises :class:`AnalysisError`."""
    path = Path(path)
    if not path.is_dir():
        return read(path)
    found = parts(path)
    if not found:
        raise AnalysisError(f"--from {str(path)!r}: a folder with no parts (part-NNN.json.gz): name a histories "
                            "file, or a folder written by `python -m analysis archive`")
    docs = [read(p) for p in found]
    names = {(d.get("experiment") or {}).get("name") for d in docs}
    if len(names) != 1:
        raise AnalysisError(f"--from {str(path)!r}: its parts hold several experiments ({sorted(map(str, names))}): "
                            "one folder of parts per experiment")
    metrics = set.intersection(*(set(d.get("metrics", ())) for d in docs))
    seen, runs = set(), []
    for d in docs:
        for run in d["runs"]:
            key = identity(run["tags"]) or run["run_id"]
            if key not in seen:
                seen.add(key)
                runs.append(run)
    complete = all(d.get("complete", False) for d in docs) and all(set(d.get("metrics", ())) == metrics for d in docs)
    return {**{k: v for k, v in docs[0].items() if k != "runs"}, "metrics": sorted(metrics), "complete": complete,
            "runs": runs}


def _records(doc: dict[str, Any], path: Path) -> tuple[list[RunRecord], dict[str, dict]]:
    records, hist = [], {}
    try:
        for run in doc["runs"]:
            latest = {k: float(NON_FINITE[v] if isinstance(v, str) else v) for k, v in run["latest"].items()}
            records.append(RunRecord(run_id=run["run_id"], run_name=run["run_name"], status=run["status"],
                                     start_time=run["start_time"], tags=run["tags"], params=run["params"],
                                     latest=latest))
            hist[run["run_id"]] = run["histories"]
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalysisError(f"--from {str(path)!r}: run {len(records) + 1} is malformed ({type(exc).__name__}: {exc}): "
                            "export it again with `python -m analysis export`") from None
    return records, hist


def load(path: str | Path, name: str | None = None, metrics: Sequence[str] | None = None,
         filter_string: str | None = None, group_by: Sequence[str] = (), include_unfinished: bool = False) -> Experiment:
    """The :class:`Experiment` of a histories file (or a folder of archived parts), with the options of
    :func:`analysis.load.load_experiment` (``name``, when given, must be the file's experiment). ``filter_string`` is refused: MLflow evaluates it.
    Raises :class:`AnalysisError`."""
    path = Path(path)
    if filter_string:
        raise AnalysisError("--filter is an MLflow search and needs the store: with --from, leave it out "
                            "(or export a store holding only the runs wanted)")
    doc = read_source(path)
    head = doc.get("experiment") or {}
    file_name = head.get("name")
    if name is not None and name != file_name:
        raise AnalysisError(f"--from {str(path)!r} holds experiment {file_name!r}, not {name!r}")
    records, hist = _records(doc, path)
    wanted = tuple(dict.fromkeys(metrics or default_metrics()))
    if not doc.get("complete", False):
        absent = [m for m in wanted if m not in set(doc.get("metrics", ()))]
        if absent:
            raise AnalysisError(f"--from {str(path)!r} was exported without {', '.join(absent)}: export it again "
                                "with every metric (the default)")

    def fetch(run_ids: list[str], ms: tuple[str, ...]) -> dict[str, dict[str, pd.Series]]:
        out: dict[str, dict[str, pd.Series]] = {m: {} for m in ms}
        for m in ms:
            for rid in run_ids:
                h = hist.get(rid, {}).get(m)
                if h and len(h["step"]):
                    out[m][rid] = pd.Series(_decode_values(h["value"]),
                                            index=pd.Index(np.asarray(h["step"], dtype=np.int64), name="step"))
        return out

    exp = assemble(file_name, str(head.get("experiment_id", "")), URI_PREFIX + str(path), records, fetch,
                   metrics=wanted, group_by=group_by, include_unfinished=include_unfinished)
    exp.tags = {str(k): str(v) for k, v in (head.get("tags") or {}).items()}
    return exp


def open_experiment(name: str | None, tracking_uri: str | None = None, source: str | Path | None = None,
                    **options) -> Experiment:
    """Experiment ``name`` from the store (:func:`analysis.load.load_experiment`), or, with ``source``, from that
    histories file (:func:`load`; ``name`` may be None: the file names it). ``options``: metrics, filter_string,
    group_by, include_unfinished."""
    if source is None:
        if not name:
            raise AnalysisError("name an experiment (--experiment) or a histories file (--from)")
        return load_experiment(name, tracking_uri, **options)
    if tracking_uri:
        raise AnalysisError("--tracking-uri names a store and --from a file: give one of the two")
    return load(source, name, **options)
