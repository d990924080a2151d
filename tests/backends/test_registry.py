"""The backend registry (``harness.backends``): each backend declared once, validate / run / command / job."""
import dataclasses
import subprocess
import sys

import pytest

from harness import backends
from harness.spec import load
from harness.errors import ConfigError
from harness.launch.spec import LauncherConfig


def test_names_and_get():
    assert backends.names() == ("local", "verl")
    for name in backends.names():
        assert backends.get(name).name == name
    with pytest.raises(KeyError, match="unknown backend 'jax'; allowed: local, verl"):
        backends.get("jax")
    local, verl = backends.get("local"), backends.get("verl")
    assert local.packable and not verl.packable
    assert local.store_finishes and not verl.store_finishes
    assert local.command is None and verl.command is not None and verl.plan is not None


def test_the_registry_loads_no_engine():
    code = "import sys, harness.backends as b; [b.get(n) for n in b.names()]; print(sorted(m for m in ('torch', 'verl', 'harness.spec') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_local_validate_names_the_key():
    cfg = load([])
    backends.get("local").validate(cfg)  # the default spec is a local one
    for change, key in (({"name": "gsm8k"}, "task"), ({"path": "/ckpt"}, "model.path")):
        bad = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, **change)) if key == "task" else \
            dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **change))
        with pytest.raises(ConfigError) as e:
            backends.get("local").validate(bad)
        assert e.value.key == key


def test_launcher_problems():
    cfg = load([])
    local = backends.get("local")
    assert local.launcher_problem(cfg, LauncherConfig(), "run 1/1") is None
    key, msg = local.launcher_problem(cfg, LauncherConfig(nodes=2), "run 1/1")
    assert key == "launcher.nodes" and "run 1/1" in msg
    threads = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, threads=4))
    assert local.launcher_problem(threads, LauncherConfig(cpus_per_task=2), "r")[0] == "launcher.cpus_per_task"
    verl = load(["backend=verl", "model=qwen3_4b", "task=gsm8k_verl"])
    key, msg = backends.get("verl").launcher_problem(verl, LauncherConfig(name="slurm"), "r")
    assert key == "launcher.gpus_per_node" and f"launcher.gpus_per_node={verl.verl.gpus_per_node}" in msg


def test_the_verl_run_files_the_registry_names_are_the_runners():
    """``--rerun`` sets aside what ``Backend.run_files`` names; the verl package lists them without importing
    its runner (harness.spec): the two lists must agree."""
    from harness import backends
    from harness.backends.verl import runner

    assert backends.get("verl").run_files == runner.RUN_FILES
    assert backends.get("local").run_files == () and backends.get("local").finished is None
