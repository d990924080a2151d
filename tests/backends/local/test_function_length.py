"""No function or method over 80 lines in the spec layer or the local engines (issue 32): the inference engine's
parts live in ``harness/backends/local/inference/``, one concept a module; read from the source with ``ast``."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 80
FILES = ("harness/spec/*.py", "harness/backends/local/inference*.py", "harness/backends/local/inference/*.py",
         "harness/backends/local/train_engine.py")


def long_functions(path: Path, root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    """``file:line name (n lines)`` (the file relative to ``root``) for every function or method of ``path``
    longer than ``limit`` lines (its decorators and docstring included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_files_exist():
    for pattern in FILES:
        assert sorted(ROOT.glob(pattern)), pattern


def test_no_function_over_80_lines_in_the_spec_or_the_engines():
    offenders = [o for pattern in FILES for path in sorted(ROOT.glob(pattern)) for o in long_functions(path)]
    assert not offenders, "functions over 80 lines:\n" + "\n".join(offenders)


def test_the_check_flags_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path / "m.py", tmp_path) == [f"m.py:1 long ({LIMIT + 1} lines)"]
