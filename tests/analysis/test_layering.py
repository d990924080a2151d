"""Layers: `harness.curves` (curve definitions), `harness.metrics` (names) and `harness.uri` (the store
rule) are leaves; `analysis` imports only those of `harness` (MLflow is the bridge), never `harness.launch`; the rest of
`harness` (but `harness.launch`, the top layer) never imports `analysis`."""
from __future__ import annotations

import ast
from pathlib import Path

import analysis.load

ROOT = Path(analysis.load.__file__).resolve().parents[1]
LEAVES = ("harness.metrics", "harness.curves", "harness.uri", "harness.history")


def imports(path: Path) -> list[str]:
    mods = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods += [node.module] if node.module not in ("harness", "analysis") else [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
    return mods


def test_analysis_imports_only_the_harness_leaves():
    offenders = [(p.name, m) for p in sorted((ROOT / "analysis").glob("*.py")) for m in imports(p)
                 if m.split(".")[0] == "harness" and m not in LEAVES]
    assert not offenders, offenders


def test_harness_below_launch_never_imports_analysis():
    offenders = [(str(p.relative_to(ROOT)), m) for p in sorted((ROOT / "harness").rglob("*.py"))
                 if "launch" not in p.relative_to(ROOT / "harness").parts for m in imports(p)
                 if m.split(".")[0] == "analysis"]
    assert not offenders, offenders


def test_leaves_import_nothing_of_the_project():
    for leaf in LEAVES:
        mods = imports(ROOT / (leaf.replace(".", "/") + ".py"))
        assert not [m for m in mods if m.split(".")[0] in ("harness", "analysis")], (leaf, mods)
