"""Issue 32: the verl backend's checks (config.validate) and its translation (translate.overrides) are split by
section into small functions run in a table order (their length: tests/test_function_length.py, the whole tree)."""
from __future__ import annotations

import dataclasses

import pytest

from harness.errors import ConfigError

from harness.backends.verl import config, translate


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
