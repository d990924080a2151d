"""Names from a store or a histories file are written as text, never as markup, a formula or a path
(analysis/escape.py, issue 45). On d747b32 the experiment name below broke out of its code span in report.md
(a heading, raw HTML, a javascript: link), <script> and a remote image passed into the tables, CSV cells began with
=HYPERLINK(, the $\\macro$ label stopped every figure (mathtext), and a --group-by key with '/' became a path."""
from __future__ import annotations

import csv
import math
import re

from analysis.__main__ import main
from analysis.escape import csv_cell, md_code, md_text
from analysis.histories import encode

EXPERIMENT = "x` <img src=x onerror=alert(1)> `\n# Injected heading\n[click](javascript:alert(1))"
SCRIPT = "<script>alert(1)</script>|col\n## H2 ![t](http://attacker.invalid/t.png)"
MACRO = "$\\undefinedmacro{x}$"
FORMULA = '=HYPERLINK("http://attacker.invalid","x")'
KEY = "team/../../../esc_tagkey"


def _doc() -> dict:
    runs = []
    for est in (SCRIPT, MACRO):
        for seed in (0, 1):
            curve = [0.2 + 0.5 * (1 - math.exp(-s / 8)) + 0.01 * seed for s in range(30)]
            runs.append({"run_id": f"{len(runs)}", "run_name": FORMULA, "status": "FINISHED", "start_time": 1000,
                         "tags": {"estimator": est, "seed": str(seed), KEY: FORMULA if seed else "plain"},
                         "params": {}, "latest": {"reward/mean": curve[-1]},
                         "histories": {"reward/mean": {"step": list(range(30)), "value": curve}}})
    return {"format": "moe-rl-harness histories", "version": 1, "experiment": {"name": EXPERIMENT, "experiment_id": "1"},
            "metrics": ["reward/mean"], "complete": True, "runs": runs}


def test_hostile_names_are_text_in_every_output(tmp_path, capsys):
    doc = _doc()
    path = tmp_path / "h.json.gz"
    path.write_bytes(encode({k: v for k, v in doc.items() if k != "runs"}, doc["runs"]))
    out = tmp_path / "out"
    assert main(["report", "--from", str(path), "--out", str(out), "--group-by", KEY, "--set", "bootstrap_reps=200",
                 "--set", "curve_reps=50"]) == 0, capsys.readouterr().err
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert all(p.parts[0] in ("out", "h.json.gz") for p in written)  # nothing outside --out
    assert (out / "by_team_.._.._.._esc_tagkey.md").is_file()  # the key made one plain file name
    assert (out / "reward_vs_step.png").is_file()  # drawn: $...$ is text, not mathtext
    md = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "CODE", (out / "report.md").read_text())  # code spans are literal
    assert md.startswith("# Analysis report: CODE\n")
    for bad in ("<img", "<script", "](javascript", "](http", "\n# Injected", "\n## H2"):
        assert bad not in md, bad
    for table in out.glob("*.md"):
        text = table.read_text()
        assert "<script" not in text and "](http" not in text, table.name
    for table in out.glob("*.csv"):
        with open(table, newline="") as f:
            cells = [c for row in csv.reader(f) for c in row]
        assert not [c for c in cells if c.startswith(("=", "+", "@"))], table.name


def test_ordinary_labels_come_out_unchanged():
    for text in ("mean_n(n=16)", "tis(C=2,token)", "trend: mean_n(n=*) (1<2<4<8<16)", "P(row > column)",
                 "gmpo_rs(eps=0.4)[estimator.gamma_min=0.8]"):
        assert md_text(text) == text
    assert md_code("demo") == "`demo`" and md_code("a`b") == "``a`b``"
    assert csv_cell("-0.5") == "-0.5" and csv_cell(-1) == -1 and csv_cell("=1+1") == "'=1+1"
    assert md_text("a\u202eb\nc") == "a b c"
