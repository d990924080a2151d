"""`python -m analysis readme`: generated blocks are refilled from report tables, prose is left alone."""
from __future__ import annotations

import pytest

from analysis.__main__ import main
from analysis.readme import ReadmeError, refresh

TABLE = "# Summary\n\n| group | final |\n|---|---:|\n| mean_n | 0.71 |\n\n<sub>Note: footer</sub>\n"
DOC = ("# Results\n\nProse before.\n\n<!-- generated: r/summary.md -->\n| stale |\n<!-- /generated -->\n\n"
       "Prose after.\n")


def test_refresh_replaces_only_the_block(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.md").write_text(TABLE)
    new, changed = refresh(DOC, tmp_path)
    assert changed == ["r/summary.md"]
    assert "| group | final |\n|---|---:|\n| mean_n | 0.71 |\n<!-- /generated -->" in new
    assert "| stale |" not in new and "Note: footer" not in new and "# Summary" not in new
    assert new.startswith("# Results\n\nProse before.") and new.endswith("Prose after.\n")
    assert refresh(new, tmp_path) == (new, [])  # idempotent


def test_cli_check_flags_stale_blocks_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.md").write_text(TABLE)
    doc = tmp_path / "README.md"
    doc.write_text(DOC)
    assert main(["readme", str(doc), "--check"]) == 1 and doc.read_text() == DOC
    assert "stale: r/summary.md" in capsys.readouterr().out
    assert main(["readme", str(doc)]) == 0 and "| mean_n | 0.71 |" in doc.read_text()
    assert main(["readme", str(doc), "--check"]) == 0


def test_missing_table_is_a_clear_error(tmp_path, capsys):
    doc = tmp_path / "README.md"
    doc.write_text(DOC)
    with pytest.raises(ReadmeError, match="r/summary.md: no such table"):
        refresh(DOC, tmp_path)
    assert main(["readme", str(doc)]) == 2 and doc.read_text() == DOC
    assert "error:" in capsys.readouterr().err


def test_the_project_results_tables_match_docs_results():
    """docs/results.md's tables are the committed reports' tables (`python -m analysis readme docs/results.md`)."""
    from analysis.load import project_root

    results = project_root() / "docs" / "results.md"
    text = results.read_text()
    new, changed = refresh(text, results.parent)
    assert text.count("<!-- generated:") >= 5
    assert changed == [], f"stale tables in docs/results.md (run `python -m analysis readme docs/results.md`): {changed}"


def test_the_readme_quotes_the_committed_stage_b_family_whole():
    """The README's confirmatory table is stage B's declared family (`python -m analysis survival`, the header command
    of sweeps/v4_stage_b.yaml), as committed (`python -m analysis readme README.md`)."""
    from analysis.load import project_root

    readme = project_root() / "README.md"
    text = readme.read_text()
    assert "<!-- generated: docs/results/v4_stage_b/pairs.md -->" in text
    new, changed = refresh(text, readme.parent)
    assert changed == [], f"stale tables in README.md (run `python -m analysis readme README.md`): {changed}"


def test_every_interval_the_prose_quotes_is_a_value_of_a_committed_table():
    """Every 'estimate [lo, hi]' written by hand in the README or docs/results.md (outside the generated
    blocks) appears verbatim in a table under docs/results/: a number in the prose is a table row's, and
    goes stale loudly when a report is regenerated with other values."""
    import re

    from analysis.load import project_root

    root = project_root()
    tables = "\n".join(p.read_text() for ext in ("*.md", "*.csv") for p in sorted((root / "docs" / "results").rglob(ext)))
    interval = re.compile(r"-?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\]")
    missing, quoted = [], 0
    for doc in ("README.md", "docs/results.md"):
        prose = re.sub(r"<!-- generated:.*?<!-- /generated -->", "", (root / doc).read_text(), flags=re.S)
        for m in interval.finditer(prose):
            quoted += 1
            if m.group(0) not in tables:
                missing.append(f"{doc}: {m.group(0)}")
    assert quoted >= 50  # the check reads the prose it is meant to
    assert not missing, f"intervals in the prose that no table under docs/results/ has: {missing}"
