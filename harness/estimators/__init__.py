"""Old-policy estimators, one module each (docs/design.md section 2), found by walking this package.

Every module of the package is imported (``pkgutil.iter_modules``, sorted by name), so a module that
``@register``-s an :class:`Estimator` subclass is an estimator: adding one is one module plus
``experiments/estimator/<name>.yaml``. ``NAMES`` lists them in table order (``rank``, then name).
"""
import importlib
import pkgutil
from typing import Any, Mapping

from harness.estimators.base import (REGISTRY, Estimator, Needs, OldPolicy, Params, PolicyForward, Style, Verl,
                                     axes, build, label_from, parameters)

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

NAMES: tuple[str, ...] = tuple(sorted(REGISTRY, key=lambda n: (REGISTRY[n].rank, n)))


def get(name: str) -> type[Estimator]:
    """The estimator class registered as ``name`` (KeyError if none)."""
    return REGISTRY[name]


def rank(name: str) -> int:
    """Position of ``name`` in ``NAMES`` (len(NAMES) for an unregistered name, e.g. from an old store)."""
    return NAMES.index(name) if name in NAMES else len(NAMES)


def label(name: str, values: Mapping[str, Any]) -> str:
    """The run label of estimator ``name`` with these parameter values (``tis(C=2,token)``); an unregistered
    name shows the legacy knobs n, C and level."""
    if name in REGISTRY:
        return REGISTRY[name].label(values)
    return label_from(name, [("n", values.get("n")), ("C", values.get("clip_c")), ("", values.get("level"))])


__all__ = ["REGISTRY", "NAMES", "Estimator", "Needs", "OldPolicy", "Params", "PolicyForward",
           "Style", "Verl", "axes", "build", "get", "label", "parameters", "rank"]
