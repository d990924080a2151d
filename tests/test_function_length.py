"""No function or method over 80 lines anywhere in the project's code: ``harness/``, ``analysis/``, ``scripts/`` and
``benchmarks/`` (issues 32, 43; one guard for the tree, read from the source with ``ast``)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
TREES = ("harness", "analysis", "scripts", "benchmarks")


def long_functions(path: Path, root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    """``file:line name (n lines)`` (the file relative to ``root``) for every function or method of ``path``, nested
    ones included, longer than ``limit`` lines (its decorators and docstring included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({n} lines)")
    return out


def sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for tree in TREES for p in (root / tree).rglob("*.py"))


def test_no_function_over_80_lines_in_the_tree():
    files = sources()
    assert {p.relative_to(ROOT).parts[0] for p in files} == set(TREES)
    offenders = [o for path in files for o in long_functions(path)]
    assert not offenders, "functions over 80 lines:\n" + "\n".join(offenders)


def test_the_check_flags_a_long_function_a_long_method_and_a_decorated_one(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    method = body.replace("    ", "        ")
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "m.py").write_text(
        f"def long():\n{body}\n\n\ndef short():\n    return 1\n\n\nclass C:\n    def method(self):\n{method}\n\n\n"
        f"@staticmethod\ndef decorated():\n" + "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 1)) + "\n")
    found = sorted(long_functions(tmp_path / "analysis" / "m.py", tmp_path))
    assert found == ["analysis/m.py:1 long (81 lines)", f"analysis/m.py:{2 * LIMIT + 13} decorated (81 lines)",
                     f"analysis/m.py:{LIMIT + 9} method (81 lines)"], found
    assert sources(tmp_path) == [tmp_path / "analysis" / "m.py"]
