"""The benchmarks and scripts are not run by the suite (timings, GPU-only runs), so a rename in the package can
break them silently (``benchmarks/rollout_speed.py`` imported ``pack._Buffer`` after it had become
``harness.tracking.StepBuffer``). Every project name they import, at top level or inside a function, must exist."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")])
PROJECT = ("harness", "analysis")


def project_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every ``import harness...`` / ``from harness... import name`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT:
            out += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] in PROJECT]
    return out


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_every_project_name_a_benchmark_or_script_imports_exists(path):
    missing = []
    for module, name, line in project_imports(path):
        mod = importlib.import_module(module)
        if name is not None and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ImportError:
                missing.append(f"{path.name}:{line}: from {module} import {name}")
    assert not missing, missing


def test_the_check_finds_a_name_that_does_not_exist(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from harness.tracking import NoSuchThing\n")
    assert project_imports(bad) == [("harness.tracking", "NoSuchThing", 2)]
    assert not hasattr(importlib.import_module("harness.tracking"), "NoSuchThing")


def test_the_cuda_check_specs_are_valid():
    """``benchmarks/cuda_check.py`` runs only where a GPU is lent: its specs must still validate here (it broke
    when ``deterministic`` gained its required ``noise`` knob)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import cuda_check
    finally:
        sys.path.pop(0)
    for est in cuda_check.ESTIMATORS:
        for model in (None, cuda_check.BIG):
            assert cuda_check.make("cpu", est, model).estimator.name == est["name"]
