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


def test_the_committed_histories_hold_no_credential_and_no_absolute_local_path():
    """Issue 45: the files written before it carried the author's store path (``sqlite:////...``) and run folders
    (``out_dir``); rewritten through :func:`analysis.histories.made_shareable` (the tables above unchanged)."""
    import gzip
    import json
    import re

    from analysis.shareable import shareable

    files = sorted((DEMO.parent).glob("*/histories*.json.gz"))
    assert len(files) >= 4
    for path in files:
        text = gzip.decompress(path.read_bytes()).decode()
        assert not re.search(r"(?<![\w.~:/<>-])/(home|work|tmp|Users|root|mnt|scratch)/", text), path
        assert not re.search(r"://[^/\s\"@]*:[^/\s\"@]*@", text), path  # no user:password@
        doc = json.loads(text)
        values = [doc["experiment"].get("tracking_uri", ""), *doc["experiment"].get("tags", {}).values()]
        values += [v for run in doc["runs"] for v in (*run["tags"].values(), *run["params"].values())]
        assert [v for v in values if shareable(v) != v] == [], path
