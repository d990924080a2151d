"""No block of six or more lines stands in two places of the code (issue 11, "Done when").

Scanned: ``harness/**/*.py``, ``analysis/**/*.py``, ``scripts/*.py`` and ``benchmarks/*.py`` (tests are not).
A line is normalised by stripping its white space; blank lines and pure-comment lines (``#`` first) are
dropped, and so are import statements (the order of a module's imports is no code to share). Every window of ``WINDOW`` consecutive normalised lines of a file is a block; the test fails
listing each block that stands in two different files, or twice in one file at places that do not overlap,
as ``file:line`` pairs (the first line of each place). Blocks made only of closing punctuation, docstring
quotes or ``else:``/``try:`` lines (``TRIVIAL``) carry no code and are not counted.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 6
GLOBS = ("harness/**/*.py", "analysis/**/*.py", "scripts/*.py", "benchmarks/*.py")
IMPORT = re.compile(r"^(import \S|from \S+ import )")
TRIVIAL = re.compile(r"^([)\]},:;]*|\"\"\"|'''|else:|try:|finally:|pass|return|\.\.\.)$")

#: pairs still present when this test was written, to be emptied by the redesign (issue 11); a listed pair
#: that no longer occurs fails the test too, so the list only shrinks
KNOWN: set[tuple[str, str]] = set()


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are neither blank, a comment, nor part of an import
    statement (``import x``, ``from x import (a, b)`` over several lines)."""
    out, in_import = [], False
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if in_import:
            in_import = ")" not in text
        elif IMPORT.match(text):
            in_import = text.endswith("(")
        elif text and not text.startswith("#"):
            out.append((no, text))
    return out


def duplicated_blocks(root: Path = ROOT, window: int = WINDOW) -> list[list[tuple[str, int]]]:
    """The places (file, index into its code lines) of each block of ``window`` code lines that stands in more
    than one place; a second place in the same file counts when it does not overlap the first."""
    places: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for rel, lines in scanned(root).items():
        for i in range(len(lines) - window + 1):
            block = tuple(text for _, text in lines[i:i + window])
            if not all(TRIVIAL.match(t) for t in block):
                places[block].append((rel, i))
    out = []
    for where in places.values():
        distinct = where[:1]
        for rel, i in where[1:]:
            if all(rel != r or abs(i - j) >= window for r, j in distinct):
                distinct.append((rel, i))
        if len(distinct) > 1:
            out.append(distinct)
    return out


def scanned(root: Path) -> dict[str, list[tuple[int, str]]]:
    """Relative path -> code lines of every scanned file."""
    files = sorted({p for g in GLOBS for p in root.glob(g) if "__pycache__" not in p.parts})
    return {p.relative_to(root).as_posix(): code_lines(p) for p in files}


def duplicated_pairs(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(file a, file b) -> the places "a:first-last ~ b:first-last" of the runs of blocks they share
    (consecutive windows merged into one run)."""
    lines = scanned(root)
    pairs: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for where in duplicated_blocks(root):
        for k, (fa, ia) in enumerate(where):
            for fb, ib in where[k + 1:]:
                (fa_, ia_), (fb_, ib_) = sorted([(fa, ia), (fb, ib)])
                pairs[(fa_, fb_)].add((ia_, ib_))
    out = {}
    for (fa, fb), starts in sorted(pairs.items()):
        runs: list[list[int]] = []
        for ia, ib in sorted(starts):
            if runs and (ia, ib) == (runs[-1][2] + 1, runs[-1][3] + 1):
                runs[-1][2:] = [ia, ib]
            else:
                runs.append([ia, ib, ia, ib])
        out[(fa, fb)] = [f"{fa}:{lines[fa][a0][0]}-{lines[fa][a1 + WINDOW - 1][0]} ~ "
                         f"{fb}:{lines[fb][b0][0]}-{lines[fb][b1 + WINDOW - 1][0]}" for a0, b0, a1, b1 in runs]
    return out


def test_no_block_of_six_lines_stands_twice():
    pairs = duplicated_pairs()
    new = {k: v for k, v in pairs.items() if k not in KNOWN}
    assert not new, "duplicated blocks of >= 6 lines:\n" + "\n".join(p for v in new.values() for p in v)
    assert not KNOWN - set(pairs), f"no longer duplicated, remove from KNOWN: {sorted(KNOWN - set(pairs))}"


def test_the_scan_finds_a_copied_block(tmp_path):
    block = "\n".join(f"x{i} = compute({i}, y)" for i in range(WINDOW))
    (tmp_path / "harness").mkdir()
    (tmp_path / "analysis").mkdir()
    (tmp_path / "harness" / "a.py").write_text(f'"""a"""\n{block}\n')
    (tmp_path / "analysis" / "b.py").write_text(f"import os\n\n# {block.splitlines()[0]}\n" + block.replace("\n", "\n\n  # c\n"))
    (tmp_path / "harness" / "c.py").write_text("\n".join(block.splitlines()[:WINDOW - 1]) + "\n")  # 5 lines: no
    (tmp_path / "harness" / "d.py").write_text(f"{block}\nz = 1\n{block}\n")  # twice in one file
    pairs = duplicated_pairs(tmp_path)
    assert set(pairs) == {("analysis/b.py", "harness/a.py"), ("analysis/b.py", "harness/d.py"),
                          ("harness/a.py", "harness/d.py"), ("harness/d.py", "harness/d.py")}
    assert pairs[("harness/d.py", "harness/d.py")] == [f"harness/d.py:1-{WINDOW} ~ harness/d.py:{WINDOW + 2}-{2 * WINDOW + 1}"]
    assert pairs[("analysis/b.py", "harness/a.py")] == [f"analysis/b.py:4-{4 + 3 * (WINDOW - 1)} ~ harness/a.py:2-{WINDOW + 1}"]
