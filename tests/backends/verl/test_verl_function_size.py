"""Issue 32: the verl backend's checks (config.validate) and its translation (translate.overrides) are split by
section into small functions run in a table order; none of the functions of those two modules exceeds
MAX_LINES lines (measured on the source with ast: a function's first to last line, decorators excluded)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from harness.errors import ConfigError

from harness.backends.verl import config, translate

MAX_LINES = 80
MODULES = (Path(config.__file__), Path(translate.__file__))


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function (nested ones included) whose body spans more than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_function_exceeds_the_limit(path):
    assert long_functions(path.read_text()) == []


def test_the_measure_catches_a_long_function():
    body = "".join(f"    x{k} = {k}\n" for k in range(MAX_LINES))  # def line + MAX_LINES lines
    src = f"def short():\n    return 1\n\n\ndef long():\n{body}\n\nclass C:\n    def method(self):\n{body.replace('    ', '        ')}"
    assert long_functions(src) == [("long", MAX_LINES + 1), ("method", MAX_LINES + 1)]
    assert long_functions("def f():\n" + "".join(f"    x{k} = {k}\n" for k in range(MAX_LINES - 1))) == []


def test_validate_runs_its_check_table_in_order(spec, monkeypatch):
    """config.validate runs every check of config.CHECKS, in the table's order, and the first failure wins."""
    cfg, seen = spec("estimator=tis", "model=qwen3_30b_a3b"), []
    monkeypatch.setattr(config, "CHECKS", tuple((lambda c, k=k: seen.append(k)) for k in range(3)))
    assert config.validate(cfg) is cfg and seen == [0, 1, 2]
    bad = dataclasses.replace(cfg, verl=dataclasses.replace(cfg.verl, strategy="x", val_every=-1))
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="verl.strategy"):
        config.validate(bad)


def test_overrides_are_the_sections_in_table_order(spec, monkeypatch):
    """translate.overrides concatenates translate.SECTIONS in order, then the +harness block."""
    cfg = spec("estimator=tis", "model=qwen3_4b")
    monkeypatch.setattr(translate, "SECTIONS", (lambda c: [("b.x", 1)], lambda c: [("a.y", 2)]))
    out = translate.overrides(cfg, commit="abc")
    assert out[:2] == ["b.x=1", "a.y=2"] and out[2].startswith("+harness.estimator=")
