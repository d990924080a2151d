"""docs/design.md's layout (section 9) is where a reader looks for a module: every module it names exists where it
says, and every module of ``harness/`` and ``analysis/`` is named there (a per-estimator, per-task or verl plugin
module excepted: the layout says "one module per estimator/task" and "plugins/")."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ("harness/estimators/", "harness/tasks/", "harness/backends/verl/plugins/")


def layout(text: str) -> set[str]:
    """The module paths the layout block names: a line's ``.py`` names belong to the innermost folder opened on a
    line indented less than it (a folder ``x/`` is opened by a line starting with it)."""
    block = text.split("## 9. Layout", 1)[1].split("```", 2)[1]
    stack: list[tuple[int, str]] = []
    out = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = line.split()[0]
        if first.endswith("/"):
            stack.append((indent, first))
        folder = "".join(name for _, name in stack)
        out |= {folder + name for name in re.findall(r"\b([a-z_]+\.py)\b", line)}
    return out


def test_the_layout_parser_reads_folders_and_continuations():
    text = "## 9. Layout\n```\nh/   a.py\n  s/   b.py\n       c.py\n  d.py\n```\n"
    assert layout(text) == {"h/a.py", "h/s/b.py", "h/s/c.py", "h/d.py"}


def test_every_module_the_layout_names_exists_and_every_module_is_named():
    named = layout((ROOT / "docs" / "design.md").read_text())
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"
    actual = {p.relative_to(ROOT).as_posix() for pkg in ("harness", "analysis") for p in (ROOT / pkg).rglob("*.py")
              if p.name != "__init__.py" and "__pycache__" not in p.parts}
    unnamed = sorted(p for p in actual - named if not p.startswith(GENERIC))
    assert not unnamed, f"modules docs/design.md's layout does not name: {unnamed}"
