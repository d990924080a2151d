"""Which MLflow tracking store a run (or the analysis) talks to: one rule, one place.

Precedence: ``tracking.uri`` (the spec) > ``MLFLOW_TRACKING_URI`` (the environment, as every MLflow
tool reads it; on a cluster it names the central server) > the project's embedded sqlite file
``sqlite:///<project>/mlruns.db``. A leaf module (standard library only): ``analysis`` imports it too.
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "MLFLOW_TRACKING_URI"


def default_tracking_uri() -> str:
    """The project's own store: ``sqlite:///<project root>/mlruns.db``."""
    return f"sqlite:///{ROOT / 'mlruns.db'}"


def resolve_tracking_uri(configured: str | None = None) -> str:
    """``configured`` if set, else ``$MLFLOW_TRACKING_URI`` if set and non-empty, else the project's store."""
    return configured or os.environ.get(ENV) or default_tracking_uri()
