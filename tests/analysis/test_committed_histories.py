"""The committed histories travel (issue 28): ``python -m analysis report --from docs/results/demo/histories.json.gz``
rebuilds every committed table of ``docs/results/demo`` byte for byte, with no MLflow store. (An analysis change
that moves a number fails here: regenerate the folder with the commands in docs/results.md.)"""
from pathlib import Path

from analysis.config import AnalysisConfig
from analysis.report import build_report

DEMO = Path(__file__).resolve().parents[2] / "docs" / "results" / "demo"


def test_the_committed_demo_histories_rebuild_the_committed_tables(tmp_path):
    build_report(None, out_dir=tmp_path, cfg=AnalysisConfig(), source=DEMO / "histories.json.gz", echo=None)
    tables = sorted(p for p in DEMO.iterdir() if p.suffix in (".md", ".csv", ".tex") and p.name != "report.md")
    assert len(tables) >= 15
    differ = [p.name for p in tables if (tmp_path / p.name).read_bytes() != p.read_bytes()]
    assert not differ, differ
