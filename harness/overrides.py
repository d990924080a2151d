"""Python values <-> Hydra override text, one rule for every caller.

``hydra_value(v)`` writes a value so that Hydra's override parser reads back the same value *and type*:
a string that would parse as something else (``"true"``, ``"null"``, ``"0.5_5.0"``, ``"1e-3"``, ``"a b"``) is
quoted; ``parse_value(text)`` is that parser (``tests/test_overrides.py`` checks the round trip). The sweep
launcher, the tuner and the verl translation all build their ``key=value`` overrides with it.
"""
from __future__ import annotations

import math
import re
from typing import Any

_SAFE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./\-]*")
_RESERVED = {"true", "false", "null", "none", "inf", "nan", "-inf", "+inf"}


class OverrideValueError(TypeError):
    """A value with no Hydra override form (e.g. an object)."""


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value that parses back to the same value and type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        if _SAFE.fullmatch(value) and value.lower() not in _RESERVED:
            return value
        return '"' + _escape(value) + '"'
    raise OverrideValueError(f"no Hydra override form for {value!r} ({type(value).__name__})")


def _escape(text: str) -> str:
    """Hydra's quoted-string escaping: a quote is escaped, and backslashes only where they precede a quote
    or the closing quote (elsewhere a backslash is literal)."""
    text = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', text)
    return re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)


def _key(k: Any) -> str:
    if not (isinstance(k, str) and _SAFE.fullmatch(k)):
        raise OverrideValueError(f"dict key {k!r} is not a plain Hydra key")
    return k


def parse_value(text: str) -> Any:
    """What Hydra's override parser makes of ``key=<text>`` (the inverse of ``hydra_value``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"k={text}").value()
