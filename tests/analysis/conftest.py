"""Fixtures: one tmp MLflow sqlite store per test session holding small synthetic experiments logged
with the harness's real tags and metric names (never the project's mlruns.db)."""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from analysis.config import AnalysisConfig
from analysis.synthetic import SyntheticRun, curve, demo_runs, log_probe_run, log_runs
from harness import metrics as M

logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)

T_DEMO = 130  # steps of the demo experiment (collapses happen at 80..100, H = 20)


@dataclass(frozen=True)
class Store:
    uri: str
    root: Path


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory) -> Path:
    """An initialised, empty MLflow sqlite database (creating one runs ~7 s of migrations: copy it)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("empty") / "m.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def logged_store(empty_db, tmp_path_factory):
    """A factory: ``logged_store({experiment: [SyntheticRun, ...]})`` -> the URI of a new store (a copy of the empty
    database) holding those experiments."""
    def make(experiments: dict) -> str:
        root = tmp_path_factory.mktemp("logged")
        shutil.copy(empty_db, root / "m.db")
        uri = f"sqlite:///{root / 'm.db'}"
        for name, runs in experiments.items():
            log_runs(uri, name, runs)
        return uri
    return make


@pytest.fixture
def fresh_store(empty_db, tmp_path) -> Store:
    """A store of one's own (a copy of the empty database under tmp_path)."""
    shutil.copy(empty_db, tmp_path / "m.db")
    return Store(f"sqlite:///{tmp_path / 'm.db'}", tmp_path)


@pytest.fixture(scope="session")
def store(empty_db, tmp_path_factory) -> Store:
    root = tmp_path_factory.mktemp("mlstore")
    shutil.copy(empty_db, root / "m.db")
    uri = f"sqlite:///{root / 'm.db'}"
    art = (root / "artifacts").as_uri()
    # a multi-seed ablation + sweeps + probes
    log_runs(uri, "demo", demo_runs(seeds=3, T=T_DEMO), artifact_location=art)
    log_probe_run(uri, "demo", "moe", 0.009, 2e-3, 1e-7)
    log_probe_run(uri, "demo", "dense", 0.002, 1e-5, 0.0)
    # one seed per group
    log_runs(uri, "single", [
        SyntheticRun("rollout", 0, curve(120, drop_at=70, seed=1)),
        SyntheticRun("mean_n", 0, curve(120, seed=2), n=8),
    ], artifact_location=art)
    # metrics missing: no mismatch/k3, no policy/loss, no time in any run
    missing = (M.MISMATCH_K3, M.POLICY_LOSS, M.TIME_STEP)
    log_runs(uri, "missing", [
        SyntheticRun("recompute", s, curve(100, seed=10 + s), drop_metrics=missing) for s in range(2)
    ] + [SyntheticRun("tis", s, curve(100, seed=20 + s), clip_c=2.0, level="token", drop_metrics=missing)
         for s in range(2)], artifact_location=art)
    # the same estimator on two models: labels must split by model
    log_runs(uri, "models", [
        SyntheticRun("rollout", s, curve(60, seed=30 + s), extra_tags={"model": m, "model_kind": k})
        for s in range(2) for m, k in (("moe_tiny", "moe"), ("dense_tiny", "dense"))
    ], artifact_location=art)
    # perturbation arms (group-by perturbation): the bias arm collapses in every run, the control in none
    log_runs(uri, "arms", [
        SyntheticRun(e, s, curve(100, drop_at=60 if arm == "bias=0.3" else None, seed=40 + 7 * s + k),
                     extra_tags={"perturbation": arm})
        for k, e in enumerate(("rollout", "recompute")) for arm in ("bias=0.3", "none") for s in range(3)
    ], artifact_location=art)
    # probe runs only
    log_probe_run(uri, "probes_only", "moe", 0.008, 1e-3, 1e-7)
    # probes of one MoE/dense pair under two perturbations and at two depths: one row each
    for pert, layers, moe_var in (("none", 2, 2e-5), ("router=1", 2, 1e-2), ("none", 8, 4e-4)):
        log_probe_run(uri, "probe_arms", "moe", 0.01, moe_var, 0.0, perturbation=pert, layers=layers)
        log_probe_run(uri, "probe_arms", "dense", 0.004, 1e-5, 0.0, perturbation=pert, layers=layers)
    return Store(uri, root)


@pytest.fixture
def fast_cfg() -> AnalysisConfig:
    """Default definitions, fewer bootstrap resamples (tests only)."""
    return AnalysisConfig(bootstrap_reps=1000, curve_reps=100)
