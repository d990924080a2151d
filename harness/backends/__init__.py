"""The backend registry: a backend is *validate, run and command* (docs/design.md).

    names()    -> ("local", "verl")
    get(name)  -> Backend: validate(cfg), run(cfg, rerun=False), command(cfg) -> argv, job(cfg), ...

Each backend declares itself once, as ``BACKEND`` in its package (``harness/backends/<name>/__init__.py``).
The registry names those packages and imports one when it is first asked for (like an entry point), so
neither importing the registry nor validating a spec loads torch or verl, and the core modules that
validate specs (``harness.spec``) do not depend on the modules that train them. The sections a backend adds
to the spec are declared here too, by module (``_SECTIONS``: verl's ``harness.backends.verl_section``), so
that loading the spec imports no backend package (``tests/test_layers.py`` checks ``sys.modules``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig

__all__ = ["Backend", "names", "get", "sections"]

_PACKAGES = {"local": "harness.backends.local", "verl": "harness.backends.verl"}
#: backend -> (section name, module, dataclass) of the spec section it contributes: what ``BACKEND.section`` says,
#: readable without importing the backend's package
_SECTIONS = {"verl": ("verl", "harness.backends.verl_section", "VerlConfig")}


@dataclass(frozen=True)
class Backend:
    """One backend.

    ``validate(cfg)``: the backend's own checks of a spec (raises ``ConfigError`` naming the key).
    ``run(cfg, rerun=False)``: train it in this process; a ``RunSummary`` (or None where the backend writes
    its result elsewhere). ``command(cfg)``: the argv that runs it (what ``--dry-run`` prints), or None
    where the backend has no command of its own (then ``--dry-run`` prints the resolved spec).
    ``job(cfg, finished_after_ms)``: the submitit callable a launcher submits for one run;
    ``pack(cfgs, finished_after_ms)``: one for several seeds of one spec (None: not packable).
    ``plan(cfg) -> exit status``: ``--plan``'s resource estimate, or None.
    ``launcher_problem(cfg, launcher, label) -> (key, message) | None``: whether a sweep's launcher
    (``harness.launch.spec.LauncherConfig``) gives the run what it needs.
    ``prunable``: ``run(cfg, on_step=f)`` calls ``f(step, metrics)`` after every step and stops the run
    (status ``pruned``) when it returns True: what a tune trial's pruner needs.
    ``finished(client, cfg, after_ms) -> result | None``: where a FINISHED run of the signature in the store
    does not mark a run done, the backend's own test (verl: the folder's ``summary.json``, written after verl
    exited 0, names a run FINISHED in this store with this ``spec_sig``: verl ends its MLflow run itself,
    FINISHED also after a crash). None: the store's FINISHED run of the signature and seed decides.
    ``run_files``: what else of a run folder ``--rerun`` sets aside (``*.prev-<time>``) besides
    ``summary.json`` and ``checkpoint.pt`` (verl: its MLflow run id, pinned commit and checkpoints).
    ``section``: ``(name, dataclass)`` of the spec section the backend contributes (verl: ``verl``, read only by
    its runs; ``harness.spec.schema`` adds it to ``RunConfig``). ``identity(spec) -> dict``: markers the backend
    adds to a spec's signature (local: its numerics version; ``harness.spec.identity``).
    """

    name: str
    validate: Callable[["RunConfig"], None]
    run: Callable[..., Any]
    job: Callable[..., Any]
    launcher_problem: Callable[..., Optional[tuple[str, str]]]
    command: Optional[Callable[["RunConfig"], list[str]]] = None
    pack: Optional[Callable[..., Any]] = None
    plan: Optional[Callable[["RunConfig"], int]] = None
    prunable: bool = False
    finished: Optional[Callable[..., Any]] = None
    run_files: tuple[str, ...] = ()
    section: Optional[tuple[str, type]] = None
    identity: Optional[Callable[[Any], dict[str, Any]]] = None

    @property
    def store_finishes(self) -> bool:
        """A FINISHED run of the signature in the store marks a run done (no ``finished`` of its own)."""
        return self.finished is None

    @property
    def packable(self) -> bool:
        """Seeds of one spec may train together in one process (a seed pack)."""
        return self.pack is not None


def names() -> tuple[str, ...]:
    """The registered backends' names."""
    return tuple(_PACKAGES)


def get(name: str) -> Backend:
    """The backend called ``name``; a ``KeyError`` naming the allowed ones where there is none."""
    if name not in _PACKAGES:
        raise KeyError(f"unknown backend {name!r}; allowed: {', '.join(_PACKAGES)}")
    backend = importlib.import_module(_PACKAGES[name]).BACKEND
    assert backend.name == name, (name, backend.name)
    return backend


def sections() -> tuple[tuple[str, str, type], ...]:
    """``(backend, section name, dataclass)`` of every section a backend contributes to the spec, in registry order;
    no backend package is imported."""
    return tuple((name, section, getattr(importlib.import_module(module), cls))
                 for name in _PACKAGES if name in _SECTIONS for section, module, cls in [_SECTIONS[name]])
