"""The README is a guide (at most 200 lines), and every relative link in it, benchmarks/README.md and docs/*.md
reaches a file.

A link is ``[text](target)``, ``![alt](target)`` or a reference ``[name]: target`` outside code
(fenced blocks and inline code spans are skipped). A target with a scheme (``https://``,
``mailto:``) or only a fragment (``#section``) is not checked; otherwise its ``#fragment`` is dropped
and the path, relative to the Markdown file, must be a file or folder of the repository: inside the
project root and, in a git work tree, tracked or at least not ignored (``mlruns.db``, ``figures/``
and ``runs/`` are not in a clone).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_README_LINES = 200

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)


def link_targets(text: str) -> list[str]:
    """The link targets of a Markdown text, code excluded."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def repository_paths(root: Path) -> set[str] | None:
    """Files of the repository (tracked or not ignored) and their folders; None outside a git work tree."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths: set[str] = set()
    for f in out.splitlines():
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return paths


def broken_links(doc: Path, root: Path, known: set[str] | None) -> list[str]:
    """The relative link targets of ``doc`` that reach no file or folder of the repository at ``root``."""
    broken = []
    for target in link_targets(doc.read_text()):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        try:
            rel = path.relative_to(root.resolve()).as_posix()
        except ValueError:
            broken.append(f"{target} (outside the repository)")
            continue
        if not path.exists() or (known is not None and rel not in known):
            broken.append(target)
    return broken


def test_readme_is_a_guide_of_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move long sections to docs/"


def test_every_relative_link_in_the_readmes_and_docs_reaches_a_file():
    known = repository_paths(ROOT)
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(docs) >= 5
    broken = {d.relative_to(ROOT).as_posix(): b for d in docs if (b := broken_links(d, ROOT, known))}
    assert not broken, f"links to nothing: {broken}"


def test_the_link_check_flags_what_is_missing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "x.png").write_bytes(b"")
    doc = tmp_path / "README.md"
    doc.write_text("[a](docs/a.md#top) ![img](docs/b.png) [web](https://example.org) [s](#sec)\n"
                   "`[code](docs/nope.md)`\n```\n[fenced](docs/nope.md)\n```\n[out](../elsewhere.md)\n"
                   "[ignored](figures/x.png)\n[ref]: docs/missing.md\n")
    known = {"docs", "docs/a.md", "README.md"}
    assert broken_links(doc, tmp_path, known) == [
        "docs/b.png", "../elsewhere.md (outside the repository)", "figures/x.png", "docs/missing.md"]
    assert broken_links(doc, tmp_path, None) == [
        "docs/b.png", "../elsewhere.md (outside the repository)", "docs/missing.md"]
