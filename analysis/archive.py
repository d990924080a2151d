"""A study that outlives its store: finished runs archived in parts that travel in git, restored into a new store.

A study longer than a working session (science v4's stage A: ~4.6 h on 2 cores) outlives the MLflow store it ran
in: a new checkout of the repository starts with none. Its finished runs are kept as **parts**, histories files
(:mod:`analysis.histories`, format version 1, a chosen list of metrics) in one folder, each written once:

- ``python -m analysis archive --experiment E --dir D --metrics m1,m2,...`` writes the experiment's FINISHED,
  complete runs that no part in ``D`` holds yet as the next part, ``D/part-NNN.json.gz``, and nothing when there are
  none. A part is never rewritten, so a commit adds a new part and changes none (git keeps each run's bytes once).
- ``python -m analysis restore --dir D [--tracking-uri URI]`` writes every run of ``D``'s parts that the store lacks
  into it (the experiment created, with the part's experiment tags, when it does not exist): the run's tags and
  params as exported, its original start time, the archived histories (step by step), status FINISHED, and two tags
  more, ``restored_from`` (the part's file name) and ``restored_run_id`` (the run's id in the store it ran in).
  ``--marks``: the tags and params only (0.057 vs 1.45 s a run, measured; tag ``restored_histories=none``): enough for a sweep to skip
  them, as a device call needs (``benchmarks/gpu_study.sh``); the analysis leaves such runs out of a store and reads
  their histories from the parts (``--from DIR``).

A run's identity is its ``(spec_sig, seed)`` tags, the key by which the harness asks a store whether a run is
finished (:func:`harness.store.finished_run`): after ``restore`` a sweep skips the restored runs and trains only
the others, and the analysis reads restored and new runs alike. A run already in a part is not archived again
(restored runs included: a ``--rerun`` after archiving stays out of the parts, which keep the first; archive before
a rerun's folder, or in a new folder); a run the store already holds FINISHED is not restored again. On the CPU a run is
bitwise the same curve whenever it is trained (docs/design.md, "Tracking and identity"), so a lost run trained again is the same
run; a restored run holds only the archived metrics (the part's ``metrics``) and no artifacts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from . import histories as H
from .histories import PART, identity, parts
from .load import (MARKS_TAG, AnalysisError, _load_histories, _search_all, client_for, default_tracking_uri,
                   store_records, warn)
from .shareable import shareable

LOCK = ".archive.lock"  # beside the parts: one archive at a time per folder
PRUNED = ("status", "pruned")  # the tag of a run the tuner stopped early (harness.store.truncated): no result


@dataclass(frozen=True)
class Archived:
    """What :func:`archive` wrote (``path`` None: nothing new to archive)."""

    path: Path | None
    runs: int
    already: int  # runs the folder's parts held before
    size: int


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` did."""

    written: int
    present: int  # runs of the parts that the store already held FINISHED
    parts: int


def _read(path: Path) -> dict:
    """A part (:func:`analysis.histories.read`), its errors worded for ``--dir``."""
    try:
        return H.read(path)
    except AnalysisError as exc:
        raise AnalysisError(str(exc).replace("--from", "--dir", 1).replace("python -m analysis export",
                                                                          "python -m analysis archive")) from None


def archived(folder: str | Path, experiment: str | None = None) -> dict[tuple[str, str], Path]:
    """The identity of every run the parts of ``folder`` hold, and its part. Parts of another experiment than
    ``experiment`` are refused (one folder, one experiment)."""
    held: dict[tuple[str, str], Path] = {}
    for path in parts(folder):
        doc = _read(path)
        name = (doc.get("experiment") or {}).get("name")
        if experiment is not None and name != experiment:
            raise AnalysisError(f"--dir {str(folder)!r}: {path.name} holds experiment {name!r}, not {experiment!r}: "
                                "one folder of parts per experiment")
        for run in doc["runs"]:
            key = identity(run["tags"])
            if key is not None:
                held.setdefault(key, path)
    return held


def archive(name: str, folder: str | Path, metrics: Sequence[str], tracking_uri: str | None = None) -> Archived:
    """Write experiment ``name``'s FINISHED, complete runs that no part of ``folder`` holds as its next part. One
    archive at a time per folder (a lock file beside the parts, ``.archive.lock``): two at once would number their
    parts alike."""
    if not metrics:
        raise AnalysisError("--metrics: name the metrics to archive (comma-separated), e.g. reward/mean,policy/loss")
    from filelock import FileLock

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / LOCK), timeout=600):
        return _archive(name, folder, metrics, tracking_uri)


def _archive(name: str, folder: Path, metrics: Sequence[str], tracking_uri: str | None) -> Archived:
    tracking_uri = tracking_uri or default_tracking_uri()
    client, exp, records = store_records(name, tracking_uri, "attributes.status = 'FINISHED'")
    held = archived(folder, name)
    finished = [r for r in records if identity(r.tags) is not None and r.tags.get(PRUNED[0]) != PRUNED[1]]
    new, seen = [], set(held)
    for r in sorted(finished, key=lambda r: -int(r.start_time or 0)):  # a rerun's newer run wins, as in the store
        if identity(r.tags) not in seen:
            seen.add(identity(r.tags))
            new.append(r)
    if not new:
        return Archived(None, 0, len(held), 0)
    chosen = sorted(dict.fromkeys(metrics))
    logged = {m for r in new for m in r.latest}
    never = [m for m in chosen if m not in logged]
    if never:
        warn(f"archive {name!r}: no run logged {', '.join(never)}: the part holds no values of it")
    histories = _load_histories(client, [r.run_id for r in new], tuple(chosen), 4)
    head = {"format": H.FORMAT, "version": H.VERSION,
            "experiment": {"name": name, "experiment_id": exp.experiment_id, "tracking_uri": shareable(tracking_uri),
                           "tags": {str(k): shareable(str(v)) for k, v in sorted((exp.tags or {}).items())}},
            "metrics": chosen, "complete": logged <= set(chosen)}
    done = parts(folder)
    number = int(PART.match(done[-1].name).group(1)) + 1 if done else 0
    path = folder / f"part-{number:03d}{H.SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(H.encode(head, [H._run_json(r, histories) for r in new]))
        os.link(tmp, path)  # never over an existing part (FileExistsError)
    finally:
        tmp.unlink(missing_ok=True)
    return Archived(path, len(new), len(held), path.stat().st_size)


def _present(client, experiment_id: str) -> set[tuple[str, str]]:
    """Identities with a FINISHED, complete run in the experiment."""
    return {k for r in _search_all(client, experiment_id, "attributes.status = 'FINISHED'")
            if r.data.tags.get(PRUNED[0]) != PRUNED[1] and (k := identity(r.data.tags)) is not None}


def _write_run(client, experiment_id: str, run: dict, part: Path, histories: bool = True) -> None:
    from mlflow.entities import Metric, Param, RunTag

    tags = {**run["tags"], "restored_from": part.name, "restored_run_id": run["tags"].get("restored_run_id",
                                                                                            run["run_id"])}
    if not histories:
        tags[MARKS_TAG] = "none"
    made = client.create_run(experiment_id, start_time=int(run["start_time"]), run_name=run["run_name"])
    rid, ts = made.info.run_id, int(run["start_time"])
    try:
        items = [RunTag(str(k), str(v)) for k, v in tags.items()]
        params = [Param(str(k), str(v)) for k, v in run["params"].items()]
        for i in range(0, max(len(items), len(params)), 100):
            client.log_batch(rid, params=params[i:i + 100], tags=items[i:i + 100])
        batch = [Metric(metric, float(v), ts, int(step)) for metric, h in run["histories"].items()
                 for step, v in zip(h["step"], H._decode_values(h["value"]))] if histories else []
        for i in range(0, len(batch), 1000):
            client.log_batch(rid, metrics=batch[i:i + 1000])
    except BaseException:  # interrupted half-way: no RUNNING copy left behind (the next restore writes it whole)
        client.delete_run(rid)
        raise
    client.set_terminated(rid, "FINISHED")


def restore(folder: str | Path, tracking_uri: str | None = None, marks: bool = False) -> Restored:
    """Write every FINISHED run of ``folder``'s parts (or of one histories file, ``analysis export``'s) that the store
    lacks into it; ``marks``: its tags and params
    only (tag ``restored_histories=none``), ~25x faster: enough for a sweep to skip it; the analysis leaves such a run
    out of a store (its histories are in the parts: ``--from DIR``)."""
    found = [Path(folder)] if Path(folder).is_file() else parts(folder)  # a folder of parts, or one histories file
    if not found:
        raise AnalysisError(f"--dir {str(folder)!r} holds no parts (part-NNN.json.gz): write them with "
                            "`python -m analysis archive`")
    tracking_uri = tracking_uri or default_tracking_uri()
    client = client_for(tracking_uri)
    written = present = 0
    for path in found:
        doc = _read(path)
        head = doc.get("experiment") or {}
        name = str(head.get("name"))
        exp = client.get_experiment_by_name(name)
        if exp is None:
            exp_id = client.create_experiment(name, tags={str(k): str(v) for k, v in (head.get("tags") or {}).items()})
        elif exp.lifecycle_stage != "active":
            raise AnalysisError(f"experiment {name!r} is deleted in the store: restore it (`mlflow experiments "
                                "restore`) or use another store (--tracking-uri)")
        else:
            exp_id = exp.experiment_id
        have = _present(client, exp_id)
        for run in doc["runs"]:
            key = identity(run["tags"])
            if run["status"] != "FINISHED" or key is None:
                continue
            if key in have:
                present += 1
                continue
            _write_run(client, exp_id, run, path, histories=not marks)
            have.add(key)
            written += 1
    return Restored(written, present, len(found))
