"""Fixtures of the launch tests: a real single-node Slurm cluster (session-scoped, started through
slurm/start.sh; skipped with the reason when Slurm's tools are absent and cannot be installed),
one MLflow sqlite store for the session. Helpers are in launch_helpers.py."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# the tests import launch_helpers by name (pytest runs with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def slurm_cluster():
    from harness.launch.cluster import LocalCluster, slurm_ready

    ok, why = slurm_ready(install=os.environ.get("HARNESS_SLURM_INSTALL", "1") != "0")
    if not ok:
        pytest.skip(f"no Slurm: {why}")
    cluster = LocalCluster()
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.fail(f"could not start the single-node Slurm cluster: {exc}")
    print(f"\n[slurm] single-node cluster up in {cluster.start_s:.1f} s ({cluster.conf})")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """One MLflow sqlite store (its tables take seconds to create) and one runs folder per session."""
    root = tmp_path_factory.mktemp("launch")
    uri = f"sqlite:///{root}/mlruns.db"
    from harness.tracking import client_for

    client_for(uri).search_experiments()  # create the tables once
    return root, uri
