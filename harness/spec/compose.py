"""Composing a spec with Hydra: the schema's defaults, then ``experiments/config.yaml`` and its groups, then
the command line's overrides (issue 32).

The base of every composition is the schema (``harness.spec.schema.defaults``, stored in Hydra's ConfigStore as
``schema``), so ``experiments/config.yaml`` lists only the groups it composes and what an experiment deliberately
changes. The shipped configs are package data (``experiments/`` beside ``harness/``, ``EXPERIMENTS``). A user's own
configs (``--config-dir DIR``, or an ``experiments/`` folder in the working directory) add presets to the shipped ones
(``estimator/mine.yaml``; a preset named like a shipped one is refused: it would be ambiguous which one a stored run
used), and a ``config.yaml`` of one's own replaces the shipped one.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Sequence

from harness import estimators
from harness.errors import ConfigError
from harness.spec.schema import RunConfig, defaults
from harness.spec.validate import build
from harness.uri import ROOT

EXPERIMENTS = ROOT / "experiments"
GROUPS = ("estimator", "model", "task", "backend")
SCHEMA = "schema"


def config_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Where configs are looked up, first match wins: ``extra`` (``--config-dir``), then ``./experiments`` when the
    working directory has one of its own, then the shipped ``EXPERIMENTS``."""
    dirs = [Path(d).expanduser().resolve() for d in extra]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError("--config-dir", f"{d} is not a folder")
    local = (Path.cwd() / "experiments").resolve()
    if local.is_dir() and local != EXPERIMENTS.resolve():
        dirs.append(local)
    return [*dirs, EXPERIMENTS]


def group_options(group: str, dirs: Sequence[Path] | None = None) -> list[str]:
    """The options of a config group: the YAML files in ``<dir>/<group>/`` of every config folder."""
    return sorted({p.stem for d in (dirs or config_dirs()) for p in (Path(d) / group).glob("*.yaml")})


def _no_shadowing(dirs: list[Path]) -> None:
    """A user's preset must not have the name of a shipped one (ConfigError naming the file and the fix)."""
    for group in GROUPS:
        shipped = {p.stem for p in (EXPERIMENTS / group).glob("*.yaml")}
        for d in dirs:
            if d.resolve() != EXPERIMENTS.resolve():
                for p in sorted((d / group).glob("*.yaml")):
                    if p.stem in shipped:
                        raise ConfigError(group, f"{p} has the name of a shipped preset ({group}={p.stem}): "
                                                 "rename it (e.g. mine_" + p.name + ")")


def _schema_node() -> dict[str, Any]:
    """The base of a composition: the schema's defaults (the estimator section: every registered knob unset; the
    chosen estimator's take their ``Params`` defaults when the spec is built, a preset sets only what differs)."""
    return defaults()


def _hydra_compose(overrides: list[str], config_name: str, dirs: list[Path]) -> dict[str, Any]:
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name=SCHEMA, node=_schema_node())
    # Hydra reads its search path from the primary config: the first folder that has it is primary, the others
    # follow in order
    primary = next((d for d in dirs if (d / f"{config_name}.yaml").is_file()), dirs[-1])
    rest = [d for d in dirs if d != primary]
    search = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in rest)}]"] if rest else []
    with initialize_config_dir(config_dir=str(primary), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=[*search, *overrides])
    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("hydra", None)
    return out


def compose(overrides: list[str], config_name: str = "config", dirs: Sequence[Path] | None = None) -> dict[str, Any]:
    """Hydra composition of ``<config_name>.yaml`` (over the schema's defaults) with command-line overrides."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    dirs = list(dirs or config_dirs())
    _no_shadowing(dirs)
    for i, ov in enumerate(overrides):
        key, sep, value = ov.lstrip("+~").partition("=")
        if not sep and not ov.startswith("~"):  # ``~key`` deletes; anything else needs its value
            nxt = overrides[i + 1] if i + 1 < len(overrides) else "VALUE"
            raise ConfigError(ov, f"an override is key=value (no spaces around '='): write {ov}={nxt}")
        if sep and key in GROUPS:
            options = group_options(key, dirs)
            if value not in options:
                raise ConfigError(key, f"unknown value {value!r}; allowed: {', '.join(options)}")
    try:
        return _compose_fast(list(overrides), config_name, dirs) or _hydra_compose(list(overrides), config_name, dirs)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _explain(exc, list(overrides), config_name, dirs) from None


def _compose_fast(overrides: list[str], config_name: str, dirs: list[Path]) -> dict[str, Any] | None:
    """Hydra's composition of ``overrides`` without a Hydra run per spec: the config groups chosen (``estimator=tis``,
    ``model=...``) composed once per distinct choice (cached), then each ``key=value`` set on a copy, its value parsed
    by Hydra's own override grammar. That is what Hydra does (groups build the defaults list, values are applied
    after it, in order), so a sweep of N runs composes once per choice of groups. None (compose the Hydra way, with
    its errors) for anything else: a new or deleted key (``+k``, ``~k``), a key the spec lacks, a section or mapping
    value, an interpolation, a sweep value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra's own path says what is wrong
        return None
    groups, values = [], []
    for text, ov in zip(overrides, parsed):
        if ov.is_add() or ov.is_delete() or ov.is_force_add() or ov.is_sweep_override() or ov.package is not None:
            return None
        (groups if ov.key_or_group in GROUPS else values).append((text, ov))
    base = _composed(tuple(t for t, _ in groups), config_name, tuple(dirs), _stamp(dirs))
    spec = copy.deepcopy(base)
    for _, ov in values:
        *path, leaf = ov.key_or_group.split(".")
        node: Any = spec
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        value = ov.value()
        if (not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], dict) or isinstance(value, dict)
                or (isinstance(value, str) and "${" in value) or path[:1] == ["hydra"]):
            return None
        node[leaf] = value
    return spec


def _stamp(dirs: list[Path]) -> tuple:
    """Every config file's path, modification time and size: a file edited since is composed anew."""
    return tuple(sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for d in dirs for p in Path(d).rglob("*.yaml")))


@functools.lru_cache(maxsize=64)
def _composed(groups: tuple[str, ...], config_name: str, dirs: tuple[Path, ...], stamp: tuple) -> dict[str, Any]:
    """The Hydra composition of a choice of config groups (kept: copy before changing it); ``stamp``: the config
    files' state it was composed from."""
    return _hydra_compose(list(groups), config_name, list(dirs))


def _explain(exc: Exception, overrides: list[str], config_name: str, dirs: list[Path]) -> ConfigError:
    """Hydra's error as a ConfigError naming the most specific key it concerns, in words a user can act on."""
    msg = str(exc).splitlines()[0]
    named = [k for k in (ov.split("=")[0].lstrip("+~") for ov in overrides) if f"'{k}'" in msg or k in msg]
    key = getattr(exc, "full_key", None) or max(named, key=len, default=None) or "spec"
    if msg.startswith("Could not override") and key != "spec":
        msg = _unknown_key(str(key), overrides, config_name, dirs) or msg
    unparsed = any(m in msg for m in ("LexerNoViableAlt", "token recognition error", "mismatched input",
                                      "Error parsing override"))
    if unparsed:  # Hydra's grammar: unquoted unicode, quotes, '=' in a value (a URI's ?password=...)
        bad = next((ov for ov in overrides if ov.split("=")[0].lstrip("+~") == key), None) \
            or next((ov for ov in overrides if "=" in ov.partition("=")[2]), None)
        key = bad.split("=")[0].lstrip("+~") if bad else key
        from harness.uri import redact

        value = redact(bad.partition("=")[2]) if bad else "..."  # a URI's password is never echoed
        msg = (f"Hydra cannot parse the value {value!r} unquoted (non-ASCII letters, quotes, '=' and some other "
               f"symbols need quotes): quote it, {quote_hint(str(key), value)} on a shell command line")
    return ConfigError(str(key), msg)


def quote_hint(key: str, value: str) -> str:
    """``key=value`` as one shell word that Hydra reads back as ``value``: Hydra's single quotes (a ``'`` inside
    escaped as ``\\'``), inside the shell's double quotes, or its single quotes when the value holds characters the
    shell's double quotes do not keep (``"``, ``$``, backquote, backslash)."""
    import shlex

    arg = f"{key}='" + value.replace("'", "\\'") + "'"
    return shlex.quote(arg) if any(c in value for c in '"$`\\') else f'"{arg}"'


def _unknown_key(key: str, overrides: list[str], config_name: str, dirs: list[Path]) -> str | None:
    """What to say of an override of a key the spec does not have: the keys its section has (an estimator's
    section: its parameters, and which estimators take this one). None when the spec without it fails too."""
    try:
        spec = compose([ov for ov in overrides if ov.split("=")[0].lstrip("+~") != key], config_name, dirs)
    except ConfigError:
        return None
    parent, _, leaf = key.rpartition(".")
    node: Any = spec
    for part in parent.split(".") if parent else ():
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return f"unknown key: the spec has no section {parent!r}"
    if parent == "estimator":
        name = node.get("name")
        own = list(estimators.get(name).param_names()) if name in estimators.REGISTRY else []
        takers = [n for n in estimators.NAMES
                  if any(f.name == leaf for f in dataclasses.fields(estimators.get(n).Params))]
        return (f"not a parameter of {name} (its parameters: {', '.join(own) or 'none'})"
                + (f"; {leaf} is a parameter of {', '.join(takers)}" if takers else ""))
    return f"unknown key; {parent or 'the spec'} has: {', '.join(sorted(node))}"


def load(overrides: list[str], config_name: str = "config", dirs: Sequence[Path] | None = None) -> RunConfig:
    """The validated ``RunConfig`` of ``overrides`` (``compose`` then ``harness.spec.validate.build``)."""
    return build(compose(overrides, config_name, dirs))
