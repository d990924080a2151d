"""The README is a guide (at most 200 lines); what the README and the docs point at exists.

Links: every relative link in README.md, benchmarks/README.md and docs/*.md reaches a file.

A link is ``[text](target)``, ``![alt](target)`` or a reference ``[name]: target`` outside code
(fenced blocks and inline code spans are skipped). A target with a scheme (``https://``,
``mailto:``) or only a fragment (``#section``) is not checked; otherwise its ``#fragment`` is dropped
and the path, relative to the Markdown file, must be a file or folder of the repository: inside the
project root and, in a git work tree, tracked or at least not ignored (``mlruns.db``, ``figures/``
and ``runs/`` are not in a clone).

Code named in the docs: an inline-code path under a project folder (``harness/launch/spec.py``) is a
file or folder of the repository, and a dotted name (``harness.backends.local.jobs.RunJob``) is a
module whose first attribute after it appears in its source. Docs cited by the code: every
``docs/X.md`` (``section N``) in ``harness/``, ``analysis/``, ``scripts/``, ``benchmarks/`` names a
file that exists (with a ``## N.`` heading), and nothing cites ``DESIGN.md`` (not in the repository).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_README_LINES = 200
DOCS = ("README.md", "benchmarks/README.md", "docs/*.md")
PROJECT_DIRS = ("harness", "analysis", "tests", "scripts", "benchmarks", "experiments", "sweeps", "slurm", "docs")
CODE_DIRS = ("harness", "analysis", "scripts", "benchmarks")

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


def doc_files(root: Path) -> list[Path]:
    return sorted(p for pattern in DOCS for p in root.glob(pattern))


def code_spans(text: str) -> list[str]:
    """Inline code of a Markdown text, one line at a time (fenced blocks hold commands, not names)."""
    return [m for line in FENCE.sub("", text).splitlines() for m in re.findall(r"`([^`]+)`", line)]


def missing_module(root: Path, dotted: str) -> str | None:
    """Why ``harness.x.y.Name`` names nothing in the tree at ``root``; None when it does."""
    parts = dotted.split(".")
    here = root
    for i, part in enumerate(parts):
        if (here / part).is_dir() and not (here / f"{part}.py").exists():
            here = here / part
            continue
        if (here / f"{part}.py").exists():
            source = (here / f"{part}.py").read_text()
            rest = parts[i + 1:]
            if rest and not re.search(rf"\b{re.escape(rest[0])}\b", source):
                return f"{rest[0]} is not in {(here / f'{part}.py').relative_to(root).as_posix()}"
            return None
        init = here / "__init__.py"
        if i and init.exists() and re.search(rf"\b{re.escape(part)}\b", init.read_text()):
            return None
        return f"no module {'.'.join(parts[:i + 1])}"
    return None


def missing_code(doc: Path, root: Path, known: set[str] | None) -> list[str]:
    """The project paths and dotted module names in ``doc``'s inline code that name nothing."""
    missing = []
    for span in code_spans(doc.read_text()):
        for path in re.findall(rf"(?<![\w/.-])((?:{'|'.join(PROJECT_DIRS)})/[^\s`'\"(),;:]*)", span):
            path = path.rstrip("/.")
            if re.search(r"[*{}<>\[\]]", path):  # a pattern, not a path
                continue
            if not (root / path).exists() or (known is not None and path not in known):
                missing.append(path)
        for dotted in re.findall(r"(?<![\w/.+-])((?:harness|analysis)(?:\.[A-Za-z_]\w*)+)", span):
            if (why := missing_module(root, dotted)):
                missing.append(f"{dotted} ({why})")
    return missing


def doc_citations(root: Path) -> list[tuple[str, str, str | None]]:
    """``(file:line, docs/X.md, section or None)`` for every doc the code cites; ``DESIGN.md`` too."""
    cites = []
    for folder in CODE_DIRS:
        for py in sorted((root / folder).rglob("*.py")):
            for n, line in enumerate(py.read_text().splitlines(), 1):
                where = f"{py.relative_to(root).as_posix()}:{n}"
                for doc, section in re.findall(r"(?<![\w/])(docs/[\w./-]+?\.md)(?: section (\d+))?", line):
                    cites.append((where, doc, section or None))
                cites += [(where, "DESIGN.md", None)] * len(re.findall(r"\bDESIGN\.md\b", line))
    return cites


def test_readme_is_a_guide_of_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move long sections to docs/"


def test_every_relative_link_in_the_readmes_and_docs_reaches_a_file():
    known = repository_paths(ROOT)
    docs = doc_files(ROOT)
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


def test_code_named_in_the_docs_exists():
    known = repository_paths(ROOT)
    missing = {d.relative_to(ROOT).as_posix(): m for d in doc_files(ROOT) if (m := missing_code(d, ROOT, known))}
    assert not missing, f"the docs name code that is not in the repository: {missing}"


def bad_citations(root: Path) -> list[str]:
    """The code's citations of a doc that does not exist, or of a section the doc does not have."""
    bad = []
    for where, doc, section in doc_citations(root):
        path = root / doc
        if not path.is_file():
            bad.append(f"{where}: {doc}")
        elif section and not re.search(rf"^## {section}\.", path.read_text(), re.M):
            bad.append(f"{where}: {doc} has no section {section}")
    return bad


def test_the_docs_the_code_cites_exist():
    assert len(doc_citations(ROOT)) >= 10
    bad = bad_citations(ROOT)
    assert not bad, bad


def test_the_code_checks_flag_what_is_missing(tmp_path):
    (tmp_path / "harness" / "launch").mkdir(parents=True)
    (tmp_path / "harness" / "launch" / "__init__.py").write_text('"""Launch: SWEEP."""\n')
    (tmp_path / "harness" / "launch" / "jobs.py").write_text("class RunJob:\n    pass\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n\n## 2. Estimators\n")
    doc = tmp_path / "docs" / "a.md"
    doc.write_text("`harness/launch/jobs.py` `harness/launch/tune.py` `harness.launch.jobs.RunJob` "
                   "`harness.launch.jobs.PackJob` `harness.launch.SWEEP` `harness.launch.executors.RunJob` "
                   "`+harness.mean_n=8` `figures/<experiment>/` `docs/results/*/report.md`\n"
                   "```\npython -m harness.nothing harness/nothing.py\n```\n")
    assert missing_code(doc, tmp_path, None) == [
        "harness/launch/tune.py", "harness.launch.jobs.PackJob (PackJob is not in harness/launch/jobs.py)",
        "harness.launch.executors.RunJob (no module harness.launch.executors)"]
    (tmp_path / "harness" / "launch" / "spec.py").write_text(
        '"""See docs/design.md section 2, docs/design.md section 7 and DESIGN.md; docs/gone.md."""\n')
    assert doc_citations(tmp_path) == [
        ("harness/launch/spec.py:1", "docs/design.md", "2"), ("harness/launch/spec.py:1", "docs/design.md", "7"),
        ("harness/launch/spec.py:1", "docs/gone.md", None), ("harness/launch/spec.py:1", "DESIGN.md", None)]
    assert bad_citations(tmp_path) == ["harness/launch/spec.py:1: docs/design.md has no section 7",
                                       "harness/launch/spec.py:1: docs/gone.md", "harness/launch/spec.py:1: DESIGN.md"]
