"""A sweep spec: the YAML schema, the command-line override grammar, and ``SweepError``.

A sweep spec (``sweeps/*.yaml``)::

    name: ablation                 # default: the file's stem
    experiment: ablation           # one MLflow experiment per sweep (default: name)
    tracking_uri: null             # default: the run config's (sqlite:///<project>/mlruns.db)
    base: [task=sort, trainer.steps=200]   # Hydra overrides applied to every run (experiments/)
    grid:                          # cartesian product of override key -> values
      estimator: [rollout, recompute, tis]
    variants:                      # optional: a list of override mappings, crossed with the grid
      - {estimator: tis, estimator.level: token}
      - {estimator: tis, estimator.level: sequence}
    seeds: [0, 1, 2, 3, 4]         # default: the config's seed
    primary:                       # optional: the primary contrasts, declared before the runs (analysis/verdicts.py)
      - [recompute, "mean_n(n=8)"] #   a pair: two group labels as the report names them
      - trend: mean_n over n       #   an ordered family of the report (Cochran-Armitage / Page / JT)
    runs_dir: null                 # run folders: <runs_dir>/<experiment>/<signature> (default <project>/runs)
    sweep_dir: null                # jobs.json, submitit logs, Optuna journal (default <runs_dir>/sweeps/<name>)
    launcher: {name: slurm, partition: gpu, time_min: 120, cpus_per_task: 1, mem_gb: 4,
               gpus_per_node: 0, nodes: 1, array_parallelism: 16, checkpoint_every: 10,
               additional: {qos: normal}, setup: ["module load cuda"],
               container: {runtime: apptainer, image: /shared/harness.sif, mounts: [/shared]}}  # optional

Command-line overrides: ``launcher=slurm`` (the launcher's name), ``launcher.KEY=VALUE``, the
top-level keys above (``experiment=x``, ``seeds=[0,1]``, ``runs_dir=/scratch/runs``), and any
other ``key=value`` is appended to ``base`` (it changes the runs' signatures).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from harness.container import ContainerError, parse as parse_container
from harness.spec import ConfigError, safe_name
from harness.overrides import OverrideValueError, hydra_value as _hydra_value
from harness.uri import home, mlflow_uri


LAUNCHERS = ("slurm", "local")
TOP_KEYS = ("name", "experiment", "tracking_uri", "base", "grid", "variants", "seeds", "runs_dir",
            "sweep_dir", "launcher", "tune", "description", "primary")


class SweepError(ValueError):
    """A sweep spec that cannot run: the message names the run and the key."""

    def __init__(self, message: str, key: str | None = None):
        self.key = key
        super().__init__(message)


@dataclass
class LauncherConfig:
    name: str = "local"  # slurm | local
    partition: Optional[str] = None  # slurm partition (default: the cluster's default)
    time_min: int = 120  # wall-clock limit per job; submitit signals USR2 `signal_delay_s` before it
    cpus_per_task: int = 1
    mem_gb: Optional[float] = 4.0  # null: the cluster's default; 0: all of the node's memory
    gpus_per_node: int = 0
    nodes: int = 1
    tasks_per_node: int = 1
    array_parallelism: int = 16  # slurm: array tasks at once; local: worker processes at once
    checkpoint_every: Optional[int] = 10  # -> trainer.checkpoint_every of every run (null: keep the spec's)
    signal_delay_s: int = 120  # USR2 this long before the time limit -> checkpoint() + requeue
    max_requeues: int = 3  # timeouts a job may be requeued after (preemptions are not counted)
    job_name: Optional[str] = None  # default: the sweep's name
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    additional: dict = field(default_factory=dict)  # any other sbatch parameter, e.g. {reservation: x}
    setup: list = field(default_factory=list)  # shell lines run before the job (module load ...)
    seeds_per_job: int = 1  # local backend: seeds of one spec trained together in one process (a seed pack)
    container: dict = field(default_factory=dict)  # slurm: run the jobs in the image (harness.container)


@dataclass
class SweepSpec:
    name: str
    path: Optional[Path]
    experiment: str
    tracking_uri: Optional[str]
    base: list[str]
    grid: dict[str, list]
    variants: list[dict[str, Any]]
    seeds: Optional[list[int]]
    runs_dir: Path
    sweep_dir: Path
    launcher: LauncherConfig
    tune: Optional[dict]
    description: str = ""
    primary: list = field(default_factory=list)  # [["A", "B"], ["trend", "family over x"]]


def parse_primary(raw: Any) -> list[list[str]]:
    """The ``primary:`` list: pairs ``[A, B]`` of group labels and ``{trend: FAMILY}`` entries, as
    ``[[A, B], ["trend", FAMILY]]``."""
    if raw is None:
        return []
    fix = "write pairs of group labels [A, B] and ordered families {trend: 'mean_n over n'}"
    if not isinstance(raw, list):
        raise SweepError(f"primary: expected a list; {fix}", key="primary")
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) and x for x in item) \
                and item[0] != item[1]:
            out.append([item[0], item[1]])
        elif isinstance(item, dict) and set(item) == {"trend"} and isinstance(item["trend"], str) and item["trend"]:
            out.append(["trend", item["trend"]])
        else:
            raise SweepError(f"primary[{i}]: {item!r} is neither a pair nor a trend; {fix}", key=f"primary[{i}]")
    return out


def hydra_value(v: Any) -> str:
    """A YAML value as Hydra override text (``harness.overrides``; a SweepError when it has none)."""
    try:
        return _hydra_value(v)
    except OverrideValueError as exc:
        raise SweepError(f"cannot turn {v!r} into a Hydra override value: {exc}") from None


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[parts[-1]] = value


def apply_cli(raw: dict, overrides: list[str]) -> dict:
    """Apply command-line overrides to the raw spec mapping (see module doc)."""
    raw = copy.deepcopy(raw)
    for ov in overrides:
        key, sep, text = ov.partition("=")
        if not sep:
            raise SweepError(f"override {ov!r}: expected KEY=VALUE", key=ov)
        value = _parse_value(text)
        if key == "launcher":
            if isinstance(value, dict):
                raw.setdefault("launcher", {}).update(value)
            else:
                _set_dotted(raw, "launcher.name", value)
        elif key.startswith("launcher."):
            if not isinstance(raw.get("launcher"), dict):
                raw["launcher"] = {}
            _set_dotted(raw, key, value)
        elif key.startswith("tune."):
            if not isinstance(raw.get("tune"), dict):
                raw["tune"] = {}
            _set_dotted(raw, key, value)
        elif key in ("name", "experiment", "tracking_uri", "seeds", "runs_dir", "sweep_dir"):
            raw[key] = value
        elif key.startswith("grid."):
            raw.setdefault("grid", {})[key[len("grid."):]] = value if isinstance(value, list) else [value]
        else:  # a run override: every run gets it
            raw.setdefault("base", [])
            raw["base"] = list(raw["base"] or []) + [ov]
    return raw


def plain_name(value: Any, key: str) -> str:
    """``value`` as a plain name (``harness.spec.safe_name``: no ``/``, ``..`` and the like), or a SweepError naming
    ``key``: a sweep's name and experiment become folders (``<runs_dir>/sweeps/<name>``, ``<runs_dir>/<experiment>``)
    and must not reach outside them."""
    text = str(value)
    try:
        safe_name(text, key)
    except ConfigError as exc:
        raise SweepError(f"{exc}; set {key} to a folder name", key=key) from None
    return text


def _require_runs(spec: "SweepSpec") -> None:
    """A plain sweep must say what to run: with no grid, variants, base or seeds it would submit one run of the
    default spec (300 steps) under a name nobody chose, so it is refused. A tune spec searches ``tune.params``."""
    if spec.tune is None and not (spec.grid or spec.variants or spec.base or spec.seeds):
        raise SweepError(f"{spec.path or 'spec'}: no runs: a sweep needs a grid (KEY: [values]), a base (overrides "
                         "every run gets) or seeds; see sweeps/tiny.yaml", key="grid")


def _launcher_from(data: Any) -> LauncherConfig:
    if data is None:
        data = {}
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict):
        raise SweepError(f"launcher: expected a mapping, got {data!r}", key="launcher")
    names = [f.name for f in fields(LauncherConfig)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise SweepError(f"launcher.{unknown[0]}: unknown key; allowed: {', '.join(names)} "
                         "(other sbatch parameters go under launcher.additional)", key=f"launcher.{unknown[0]}")
    lc = LauncherConfig(**{k: v for k, v in data.items()})
    lc.name = str(lc.name)
    if lc.name not in LAUNCHERS:
        raise SweepError(f"launcher: unknown launcher {lc.name!r}; allowed: {', '.join(LAUNCHERS)}", key="launcher")
    for k in ("time_min", "cpus_per_task", "nodes", "tasks_per_node", "array_parallelism", "signal_delay_s",
              "seeds_per_job"):
        v = getattr(lc, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SweepError(f"launcher.{k}: expected an integer >= 1, got {v!r}", key=f"launcher.{k}")
    for k in ("gpus_per_node", "max_requeues"):
        v = getattr(lc, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SweepError(f"launcher.{k}: expected an integer >= 0, got {v!r}", key=f"launcher.{k}")
    if lc.mem_gb is not None and (isinstance(lc.mem_gb, bool) or not isinstance(lc.mem_gb, (int, float)) or lc.mem_gb < 0):
        raise SweepError(f"launcher.mem_gb: expected a number >= 0 (0: the whole node) or null, got {lc.mem_gb!r}",
                         key="launcher.mem_gb")
    if lc.checkpoint_every is not None and (isinstance(lc.checkpoint_every, bool)
                                            or not isinstance(lc.checkpoint_every, int) or lc.checkpoint_every < 0):
        raise SweepError(f"launcher.checkpoint_every: expected an integer >= 0 or null, got {lc.checkpoint_every!r}",
                         key="launcher.checkpoint_every")
    if not isinstance(lc.additional, dict):
        raise SweepError(f"launcher.additional: expected a mapping of sbatch parameters, got {lc.additional!r}",
                         key="launcher.additional")
    if isinstance(lc.setup, str):
        lc.setup = [lc.setup]
    if not isinstance(lc.setup, list) or not all(isinstance(x, str) for x in lc.setup):
        raise SweepError(f"launcher.setup: expected a list of shell lines, got {lc.setup!r}", key="launcher.setup")
    try:
        parse_container(lc.container)
    except ContainerError as exc:
        raise SweepError(str(exc), key=exc.key) from None
    if lc.container and lc.name != "slurm":
        raise SweepError("launcher.container: runs jobs in the image through Slurm's srun; use launcher=slurm",
                         key="launcher.container")
    if lc.name == "local" and lc.nodes > 1:
        raise SweepError("launcher.nodes: the local launcher runs on one machine; use launcher=slurm for nodes > 1",
                         key="launcher.nodes")
    return lc


def parse_spec(raw: dict, path: Path | None = None) -> SweepSpec:
    if not isinstance(raw, dict):
        raise SweepError(f"{path or 'spec'}: expected a YAML mapping at the top level")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise SweepError(f"{unknown[0]}: unknown sweep key; allowed: {', '.join(TOP_KEYS)}", key=unknown[0])
    name = plain_name(raw.get("name") or (path.stem if path else "sweep"), "name")
    experiment = plain_name(raw.get("experiment") or name, "experiment")
    base = raw.get("base") or []
    if isinstance(base, dict):  # allow a mapping form
        base = [f"{k}={hydra_value(v)}" for k, v in base.items()]
    if not isinstance(base, list) or not all(isinstance(x, str) and "=" in x for x in base):
        raise SweepError(f"base: expected a list of KEY=VALUE overrides, got {base!r}", key="base")
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise SweepError(f"grid: expected a mapping KEY: [values], got {grid!r}", key="grid")
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise SweepError(f"grid.{k}: expected a non-empty list of values, got {vals!r}", key=f"grid.{k}")
    variants = raw.get("variants") or []
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise SweepError(f"variants: expected a list of mappings KEY: value, got {variants!r}", key="variants")
    seeds = raw.get("seeds")
    if seeds is not None:
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            seeds = [seeds]
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise SweepError(f"seeds: expected a non-empty list of integers, got {seeds!r}", key="seeds")
        if len(set(seeds)) != len(seeds):
            raise SweepError(f"seeds: repeated seed in {seeds}", key="seeds")
    overlap = set(grid) & {k for v in variants for k in v}
    if overlap:
        k = sorted(overlap)[0]
        raise SweepError(f"grid.{k}: also set by variants; set each key in one place", key=f"grid.{k}")
    if "seed" in grid or any("seed" in v for v in variants):
        raise SweepError("seed: use the top-level `seeds:` list, not grid/variants", key="seed")
    runs_dir = Path(raw["runs_dir"]).expanduser() if raw.get("runs_dir") else home() / "runs"
    sweep_dir = Path(raw["sweep_dir"]).expanduser() if raw.get("sweep_dir") else runs_dir / "sweeps" / name
    tune = raw.get("tune")
    if tune is not None and not isinstance(tune, dict):
        raise SweepError(f"tune: expected a mapping, got {tune!r}", key="tune")
    spec = SweepSpec(
        name=name, path=path, experiment=experiment,
        # an http store's credentials go to the environment the jobs inherit (harness.uri.mlflow_uri), not into
        # the spec every job pickles
        tracking_uri=mlflow_uri(str(raw["tracking_uri"])) if raw.get("tracking_uri") else None,
        base=list(base), grid=dict(grid), variants=list(variants), seeds=seeds, runs_dir=runs_dir.resolve(),
        sweep_dir=sweep_dir.resolve(), launcher=_launcher_from(raw.get("launcher")), tune=tune,
        description=str(raw.get("description") or ""), primary=parse_primary(raw.get("primary")),
    )
    _require_runs(spec)
    return spec


def load_spec(path: str | Path, overrides: list[str] = ()) -> SweepSpec:
    p = Path(path)
    if not p.exists():
        raise SweepError(f"{p}: no such sweep spec")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SweepError(f"{p}: not valid YAML: {exc}") from None
    if raw is None:
        raise SweepError(f"{p}: empty sweep spec: a sweep needs a grid (KEY: [values]), a base or seeds; "
                         "see sweeps/tiny.yaml", key="grid")
    if not isinstance(raw, dict):  # before the overrides go into it (a list or a scalar: a TypeError on d747b32)
        raise SweepError(f"{p}: expected a YAML mapping at the top level (name:, base:, grid:, seeds: ...), got a "
                         f"{type(raw).__name__}; see sweeps/tiny.yaml", key="spec")
    return parse_spec(apply_cli(raw, list(overrides)), p)
