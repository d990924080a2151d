"""``python -m analysis readme [FILE]``: refresh the generated blocks of a Markdown file from report tables
(``docs/results.md`` by default).

A generated block names the table it holds, relative to the file::

    <!-- generated: docs/results/ablation/summary.md -->
    | group | runs | final | ... |        <- replaced by the table's current rows
    <!-- /generated -->

A block may name several tables (``generated: a.md b.md``): they are stacked. Only the table rows
(lines starting with ``|``) are taken: the tables' titles and parameter footers stay in the reports
they come from (``report.md``), which ``docs/results.md`` links. The prose around the blocks is not touched:
it is the interpretation, and a stale block is caught by ``--check`` (exit 1), as CI would.
"""
from __future__ import annotations

import re
from pathlib import Path

BLOCK = re.compile(r"(<!-- generated: (?P<paths>[^>]+?) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


class ReadmeError(Exception):
    pass


def table_rows(path: Path) -> str:
    """The Markdown table of a report table file (``<name>.md``)."""
    if not path.exists():
        raise ReadmeError(f"{path}: no such table (run `python -m analysis report ... --out {path.parent}` first)")
    rows = [line for line in path.read_text().splitlines() if line.startswith("|")]
    if not rows:
        raise ReadmeError(f"{path}: holds no Markdown table")
    return "\n".join(rows) + "\n"


def refresh(text: str, base: Path) -> tuple[str, list[str]]:
    """``text`` with every generated block refilled; and the paths of the blocks that changed."""
    changed: list[str] = []

    def fill(m: re.Match) -> str:
        paths = m.group("paths").split()
        body = "\n".join(table_rows(base / p) for p in paths)
        if body != m.group("body"):
            changed.append(" ".join(paths))
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), changed


def main(file: str, check: bool = False) -> int:
    path = Path(file)
    if not path.exists():
        raise ReadmeError(f"{path}: no such file")
    text = path.read_text()
    blocks = len(BLOCK.findall(text))
    if not blocks:
        raise ReadmeError(f"{path}: no `<!-- generated: TABLE.md -->` ... `<!-- /generated -->` block")
    new, changed = refresh(text, path.parent)
    for c in changed:
        print(f"{'stale' if check else 'updated'}: {c}")
    if check:
        return 1 if changed else 0
    if changed:
        path.write_text(new)
    print(f"{path}: {blocks} generated blocks, {len(changed)} updated")
    return 0
