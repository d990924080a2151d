"""`analysis` imports nothing from `harness` but the metric-name catalogue: MLflow is the only bridge."""
from __future__ import annotations

import ast
from pathlib import Path

import analysis.load


ALLOWED = ("harness.metrics", "harness.uri", "harness.curves")  # leaf modules: names, the store rule, curve definitions


def test_only_harness_metrics_is_imported():
    pkg = Path(analysis.load.__file__).parent
    offenders = []
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] if node.module != "harness" else [f"harness.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            offenders += [(path.name, m) for m in mods if m.split(".")[0] == "harness" and m not in ALLOWED]
    assert not offenders, offenders
