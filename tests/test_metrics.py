"""The metric catalogue is the one place metric names are documented: docs/metrics.md's table is it."""
from __future__ import annotations

from pathlib import Path

from harness import metrics as M

ROOT = Path(__file__).resolve().parents[1]


def test_docs_metric_table_is_the_catalogue():
    assert M.markdown_table() in (ROOT / "docs" / "metrics.md").read_text()


def test_every_constant_is_catalogued_and_namespaced():
    names = [v for k, v in vars(M).items() if k.isupper() and isinstance(v, str)]
    assert set(names) == set(M.CATALOGUE) | set(M.PROBE_CATALOGUE) and set(M.PROBE_CATALOGUE) == set(M.PROBE_METRICS)
    assert all("/" in n for n in names)  # namespaced
    rows = M.markdown_table().splitlines()[2:]
    assert len(rows) == len(M.CATALOGUE) + len(M.PROBE_CATALOGUE)
    assert all(r.replace("\\|", "").count("|") == 3 for r in rows), rows  # 2 cells: "||" in KL(p || q) is escaped
    assert set(M.KWAIKAT_PROBE["moe"]) == set(M.PROBE_METRICS)
