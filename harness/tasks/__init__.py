"""Tasks, one module each (``harness/tasks/<name>.py`` declares a :class:`TaskSpec`; see ``base.py``).

Every module of this package is imported here (``pkgutil.iter_modules``; ``base`` and ``vocab`` register
nothing), so a new task is one module plus ``experiments/task/<name>.yaml``. Importing this package loads neither torch nor
``harness.spec``.
"""
from __future__ import annotations

import importlib
import pkgutil

from harness.tasks.base import TaskSpec

REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"task {spec.name!r} is registered twice")
    REGISTRY[spec.name] = spec
    return spec


def names(backend: str | None = None) -> tuple[str, ...]:
    """Registered task names (those ``backend`` can run, when given), sorted."""
    return tuple(sorted(n for n, s in REGISTRY.items() if backend is None or backend in s.backends))


def get(name: str) -> TaskSpec:
    """The spec of task ``name`` (KeyError naming the known tasks)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(names())}")
    return REGISTRY[name]


for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["REGISTRY", "TaskSpec", "get", "names", "register"]
