"""Primary contrasts, declared before the runs (issue 28): where a sweep records them and how the analysis reads them.

A sweep spec's ``primary:`` list (``harness.launch.spec.parse_primary``: pairs of group labels and ordered
families) is recorded when the sweep submits, before any of its jobs starts: in ``<sweep_dir>/primary.json`` and as
the MLflow experiment tag ``primary_contrasts`` (the same JSON: ``{"contrasts": [...], "declared_at_ms": T,
"history": [...]}``). Submitting again with the same list keeps the first declaration time (read from
``primary.json``, else from the experiment's tag: a new checkout's store restored from archived parts,
:mod:`analysis.archive`); a changed list is a new
declaration with its own time, the earlier ones kept in ``history``. ``python -m analysis report`` tests the
declared contrasts first (Holm among themselves) and calls them *pre-registered* only when the declaration is older
than the first run of the experiment it tests (its MLflow start time); otherwise they are labelled primary, not
pre-registered.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from harness.metrics import EXPERIMENT_TAGS

TAG = EXPERIMENT_TAGS["primary"]
FILE = "primary.json"


def declaration(contrasts: list, previous: dict | None, now_ms: int | None = None) -> dict:
    """The record to store: ``previous`` when it declares the same contrasts, else a new one keeping the history."""
    if previous and previous.get("contrasts") == contrasts:
        return previous
    history = list((previous or {}).get("history", []))
    if previous:
        history.append({k: previous[k] for k in ("contrasts", "declared_at_ms")})
    return {"contrasts": contrasts, "declared_at_ms": int(time.time() * 1000) if now_ms is None else now_ms,
            "history": history}


def declare(spec, tracking_uri: str) -> dict | None:
    """Record ``spec.primary`` in the sweep folder and as the experiment's tag (the experiment exists by now)."""
    if not spec.primary:
        return None
    from harness.tracking import client_for

    path = Path(spec.sweep_dir) / FILE
    client = client_for(tracking_uri)
    exp = client.get_experiment_by_name(spec.experiment)
    previous = json.loads(path.read_text()) if path.exists() else None
    if previous is None and exp.tags.get(TAG):  # a new checkout whose store holds the declaration (analysis restore)
        previous = json.loads(exp.tags[TAG])
    record = declaration(spec.primary, previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    client.set_experiment_tag(exp.experiment_id, TAG, json.dumps(record, sort_keys=True))
    return record


def declared(tracking_uri: str, experiment_id: str) -> dict | None:
    """The experiment's declaration (the tag), or None."""
    from harness.tracking import client_for

    tag = client_for(tracking_uri).get_experiment(experiment_id).tags.get(TAG)
    return json.loads(tag) if tag else None


def as_contrasts(record: dict | None) -> list[tuple]:
    """The declaration as the analysis takes it: ``[(A, B), ("trend", FAMILY)]``."""
    return [tuple(c) for c in (record or {}).get("contrasts", [])]
