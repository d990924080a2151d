"""Sweeps: a YAML spec -> many runs -> validated whole -> submitted through submitit.

``python -m harness.sweep SPEC.yaml [OVERRIDE ...] [--rerun] [--dry-run]``

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
    runs_dir: null                 # run folders: <runs_dir>/<experiment>/<signature> (default <project>/runs)
    sweep_dir: null                # jobs.json, submitit logs, Optuna journal (default <runs_dir>/sweeps/<name>)
    launcher: {name: slurm, partition: gpu, time_min: 120, cpus_per_task: 1, mem_gb: 4,
               gpus_per_node: 0, nodes: 1, array_parallelism: 16, checkpoint_every: 10,
               additional: {qos: normal}, setup: ["module load cuda"]}

Command-line overrides: ``launcher=slurm`` (the launcher's name), ``launcher.KEY=VALUE``, the
top-level keys above (``experiment=x``, ``seeds=[0,1]``, ``runs_dir=/scratch/runs``), and any
other ``key=value`` is appended to ``base`` (it changes the runs' signatures).

Identity: every run is built into a :class:`harness.config.RunConfig` before anything is
submitted (one bad value -> one error naming the run and the key, exit 2, nothing submitted).
A run is finished when the sweep's MLflow store holds a FINISHED run of its signature in the sweep's
experiment (``harness.store``; a ``summary.json`` left in a folder does not count): it is skipped; a
run whose recorded job is still pending/running is left alone; ``--rerun`` resubmits finished runs
from scratch (their folder files kept as ``*.prev-<time>``; the old MLflow runs stay, superseded).
The store is checked first (seconds; unreachable: exit 1) and every job logs to that same store.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from harness.config import ROOT, ConfigError, RunConfig, build, compose
from harness.overrides import OverrideValueError, hydra_value as _hydra_value
from harness.uri import resolve_tracking_uri

SUMMARY_FILE = "summary.json"  # written by harness.run.execute when a run is over
CHECKPOINT_FILE = "checkpoint.pt"
LAUNCHERS = ("slurm", "local")
TOP_KEYS = ("name", "experiment", "tracking_uri", "base", "grid", "variants", "seeds", "runs_dir",
            "sweep_dir", "launcher", "tune", "description")

USAGE = """usage: python -m harness.sweep SPEC.yaml [OVERRIDE ...] [--rerun] [--dry-run] [--wait]

  SPEC.yaml      a sweep spec (sweeps/*.yaml)
  OVERRIDE       launcher=slurm|local, launcher.KEY=VALUE, experiment=NAME, seeds=[0,1],
                 runs_dir=PATH, sweep_dir=PATH, or any run override key=value (added to base)
  --rerun        resubmit runs that already finished (from scratch); running ones are left alone
  --dry-run      validate and print the plan; submit nothing
  --wait         block until every run of the sweep has finished (the demo uses it)
Exit status: 0 submitted (or nothing to do), 2 invalid spec (nothing submitted), 1 submission failed
(with --wait: a run failed)."""


class SweepError(ValueError):
    """A sweep spec that cannot run: the message names the run and the key."""

    def __init__(self, message: str, key: str | None = None):
        self.key = key
        super().__init__(message)


# ------------------------------------------------------------------------------------ spec types
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


@dataclass
class PlannedRun:
    index: int  # 0-based position in the sweep
    total: int
    name: str  # the keys that vary across the sweep, e.g. "estimator=tis estimator.clip_c=3 seed=0"
    overrides: list[str]  # everything given to Hydra for this run
    cfg: Optional[RunConfig] = None

    @property
    def signature(self) -> str:
        assert self.cfg is not None
        return self.cfg.signature

    @property
    def label(self) -> str:
        return f"run {self.index + 1}/{self.total} ({self.name or 'base'})"


# ------------------------------------------------------------------------------------- parsing
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
    name = str(raw.get("name") or (path.stem if path else "sweep"))
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
    runs_dir = Path(raw["runs_dir"]).expanduser() if raw.get("runs_dir") else ROOT / "runs"
    sweep_dir = Path(raw["sweep_dir"]).expanduser() if raw.get("sweep_dir") else runs_dir / "sweeps" / name
    tune = raw.get("tune")
    if tune is not None and not isinstance(tune, dict):
        raise SweepError(f"tune: expected a mapping, got {tune!r}", key="tune")
    return SweepSpec(
        name=name, path=path, experiment=str(raw.get("experiment") or name), tracking_uri=raw.get("tracking_uri"),
        base=list(base), grid=dict(grid), variants=list(variants), seeds=seeds, runs_dir=runs_dir.resolve(),
        sweep_dir=sweep_dir.resolve(), launcher=_launcher_from(raw.get("launcher")), tune=tune,
        description=str(raw.get("description") or ""),
    )


def load_spec(path: str | Path, overrides: list[str] = ()) -> SweepSpec:
    p = Path(path)
    if not p.exists():
        raise SweepError(f"{p}: no such sweep spec")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SweepError(f"{p}: not valid YAML: {exc}") from None
    return parse_spec(apply_cli(raw, list(overrides)), p)


# ----------------------------------------------------------------------------------- expansion
def _fmt(v: Any) -> str:
    return hydra_value(v)


def expand(spec: SweepSpec) -> list[PlannedRun]:
    """All runs of the sweep, in a stable order: variants x grid (in key order) x seeds."""
    keys = list(spec.grid)
    combos = list(itertools.product(*[spec.grid[k] for k in keys])) if keys else [()]
    variants = spec.variants or [{}]
    varying = {k for k in keys if len(spec.grid[k]) > 1}
    if len(variants) > 1:
        varying |= {k for v in variants for k in v}
    items: list[tuple[list[str], list[str]]] = []
    for variant in variants:
        for combo in combos:
            chosen = list(variant.items()) + list(zip(keys, combo))
            ovs = [f"{k}={_fmt(v)}" for k, v in chosen]
            shown = [f"{k}={_fmt(v)}" for k, v in chosen if k in varying]
            for seed in (spec.seeds if spec.seeds is not None else [None]):
                s_ov = [] if seed is None else [f"seed={seed}"]
                s_shown = [] if seed is None or len(spec.seeds or []) < 2 else [f"seed={seed}"]
                items.append((spec.base + ovs + s_ov, shown + s_shown))
    return [PlannedRun(index=i, total=len(items), name=" ".join(shown), overrides=ovs)
            for i, (ovs, shown) in enumerate(items)]


def run_overrides(spec: SweepSpec, extra: list[str] = ()) -> list[str]:
    """Launcher-implied overrides every run gets."""
    out = []
    if spec.launcher.checkpoint_every is not None:
        out.append(f"trainer.checkpoint_every={spec.launcher.checkpoint_every}")
    return out + list(extra)


def build_run(spec: SweepSpec, overrides: list[str], name: str = "") -> RunConfig:
    """Compose + validate one run; tracking and out_dir come from the sweep (not identity keys)."""
    data = compose(run_overrides(spec) + list(overrides))
    data.setdefault("tracking", {})
    data["tracking"]["experiment"] = spec.experiment
    # pinned: every job logs to the store the sweep checked (tracking_uri > $MLFLOW_TRACKING_URI > project)
    data["tracking"]["uri"] = resolve_tracking_uri(spec.tracking_uri or data["tracking"].get("uri"))
    data["tracking"]["run_name"] = name or None
    data["out_dir"] = None
    cfg = build(data)
    cfg.out_dir = str(spec.runs_dir / spec.experiment / cfg.signature)  # not an identity key
    return cfg


def validate(spec: SweepSpec, runs: list[PlannedRun] | None = None) -> list[PlannedRun]:
    """Build every run; raise one SweepError listing every bad run (with its key) if any is invalid."""
    runs = expand(spec) if runs is None else runs
    if not runs:
        raise SweepError(f"sweep {spec.name}: expands to no runs")
    errors: list[tuple[PlannedRun, ConfigError]] = []
    for r in runs:
        try:
            r.cfg = build_run(spec, r.overrides, name=r.name or spec.name)
        except ConfigError as exc:
            errors.append((r, exc))
    if errors:
        lines = [f"{r.label}: {exc}" for r, exc in errors[:10]]
        if len(errors) > 10:
            lines.append(f"... and {len(errors) - 10} more invalid runs")
        raise SweepError(f"sweep {spec.name}: {len(errors)} of {len(runs)} runs invalid, nothing submitted:\n  "
                         + "\n  ".join(lines), key=errors[0][1].key)
    # launcher vs runs
    lc = spec.launcher
    for r in runs:
        if r.cfg.backend.name == "verl":
            v = r.cfg.verl
            if lc.name == "slurm":
                for key, want in (("nodes", v.nnodes), ("gpus_per_node", v.gpus_per_node), ("tasks_per_node", 1)):
                    if getattr(lc, key) != want:
                        raise SweepError(f"launcher.{key}: {r.label} is a verl run on {v.nnodes} node(s) x "
                                         f"{v.gpus_per_node} GPUs (one task per node): set launcher.{key}={want}, "
                                         f"not {getattr(lc, key)}", key=f"launcher.{key}")
            elif v.nnodes > 1:
                raise SweepError(f"launcher: {r.label} is a verl run on {v.nnodes} nodes; use launcher=slurm",
                                 key="launcher")
            continue
        if lc.nodes != 1 or lc.tasks_per_node != 1:
            raise SweepError(f"launcher.nodes: {r.label} runs on the local backend: one task on one node "
                             f"(launcher.nodes=1, launcher.tasks_per_node=1), not {lc.nodes} x {lc.tasks_per_node}",
                             key="launcher.nodes" if lc.nodes != 1 else "launcher.tasks_per_node")
        if r.cfg.backend.threads > spec.launcher.cpus_per_task * max(1, spec.launcher.tasks_per_node):
            raise SweepError(f"launcher.cpus_per_task: {spec.launcher.cpus_per_task} CPUs per job but {r.label} "
                             f"uses backend.threads={r.cfg.backend.threads}; raise launcher.cpus_per_task or lower "
                             "backend.threads", key="launcher.cpus_per_task")
        if r.cfg.backend.device == "cuda" and spec.launcher.name == "slurm" and spec.launcher.gpus_per_node < 1:
            raise SweepError(f"launcher.gpus_per_node: {r.label} runs on cuda but the jobs ask for no GPU",
                             key="launcher.gpus_per_node")
    return dedupe(runs)


def dedupe(runs: list[PlannedRun]) -> list[PlannedRun]:
    seen: dict[str, PlannedRun] = {}
    out = []
    for r in runs:
        if r.signature in seen:
            print(f"note: {r.label} is the same run as {seen[r.signature].label} (signature {r.signature}); "
                  "it runs once", file=sys.stderr)
            continue
        seen[r.signature] = r
        out.append(r)
    return out


# --------------------------------------------------------------------------------- job records
class JobsDB:
    """``<sweep_dir>/jobs.json``: signature -> the job that runs it (latest submission)."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / "jobs.json"
        self.data: dict[str, Any] = {"runs": {}, "trials": {}}
        if self.path.exists():
            try:
                self.data.update(json.loads(self.path.read_text()))
            except json.JSONDecodeError:
                pass

    @property
    def runs(self) -> dict[str, dict]:
        return self.data.setdefault("runs", {})

    @property
    def trials(self) -> dict[str, dict]:
        return self.data.setdefault("trials", {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        tmp.replace(self.path)


@dataclass
class Decision:
    run: PlannedRun
    action: str  # submit | finished | running
    detail: str = ""


def finished_in_store(spec: SweepSpec, runs: list[PlannedRun]) -> set[str]:
    """Signatures finished in the sweep's store (one query); local-backend runs only: a verl run is
    finished when its folder holds ``summary.json`` (its MLflow run is ended by verl)."""
    from harness import store
    from harness.launch.executors import SubmissionError
    from harness.tracking import TrackingError

    if not runs:
        return set()
    uri = runs[0].cfg.tracking_uri
    try:
        store.check(uri)
        done = store.finished_signatures(uri, spec.experiment)
    except TrackingError as exc:
        raise SubmissionError(str(exc)) from None
    return {r.signature for r in runs if (r.signature in done if r.cfg.backend.name == "local"
                                           else (r.cfg.run_dir / SUMMARY_FILE).exists())}


def plan(spec: SweepSpec, runs: list[PlannedRun], rerun: bool = False) -> list[Decision]:
    from harness.launch.executors import job_states

    finished = finished_in_store(spec, runs)
    db = JobsDB(spec.sweep_dir)
    recorded = {sig: rec for sig, rec in db.runs.items() if rec.get("job_id")}
    states = job_states(list(recorded.values()))
    out = []
    for r in runs:
        rec = recorded.get(r.signature)
        state = states.get(rec["job_id"]) if rec else None
        if rec and state is not None and state.alive:
            out.append(Decision(r, "running", f"job {rec['job_id']} {state.state}"))
        elif r.signature in finished and not rerun:
            out.append(Decision(r, "finished", _summary_status(r.cfg.run_dir)))
        else:
            out.append(Decision(r, "submit", "rerun" if r.signature in finished else ""))
    return out


def _summary_status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text()).get("status", "finished")
    except (OSError, json.JSONDecodeError):
        return "finished"


def prepare_tracking(spec: SweepSpec, cfg: RunConfig) -> None:
    """Create the MLflow store and the sweep's experiment once, before jobs race to do it."""
    from harness.tracking import client_for, experiment_id

    uri = cfg.tracking_uri
    try:
        experiment_id(client_for(uri), spec.experiment, uri)
    except Exception as exc:  # noqa: BLE001
        raise SweepError(f"tracking_uri: cannot reach the MLflow store {uri!r}: {exc}", key="tracking_uri") from None


def archive_finished(run_dir: Path) -> None:
    """--rerun: keep the previous result beside the folder, and start the run from scratch."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (SUMMARY_FILE, CHECKPOINT_FILE):
        p = run_dir / name
        if p.exists():
            p.replace(run_dir / f"{name}.prev-{stamp}")


def submit_sweep(spec: SweepSpec, rerun: bool = False, dry_run: bool = False, out=None) -> list[Decision]:
    """Validate, plan and submit; returns the decisions (what was submitted, skipped, left alone)."""
    out = sys.stdout if out is None else out
    from harness.launch import executors

    t0 = time.time()
    runs = validate(spec)
    decisions = plan(spec, runs, rerun=rerun)
    todo = [d for d in decisions if d.action == "submit"]
    n_fin = sum(d.action == "finished" for d in decisions)
    n_run = sum(d.action == "running" for d in decisions)
    print(f"sweep {spec.name}: {len(runs)} runs valid ({time.time() - t0:.1f} s); {len(todo)} to submit, "
          f"{n_fin} finished (skipped), {n_run} running (left alone); launcher {spec.launcher.name}; "
          f"MLflow experiment {spec.experiment!r}", file=out)
    if dry_run:
        for d in decisions:
            print(f"  {d.action:8s} {d.run.signature}  {d.run.name or 'base'}  {d.detail}", file=out)
        return decisions
    if not todo:
        return decisions
    prepare_tracking(spec, todo[0].run.cfg)
    after_ms = 0
    if rerun:
        after_ms = int(time.time() * 1000)  # the jobs' runs: a FINISHED run older than this does not count
        for d in todo:
            archive_finished(d.run.cfg.run_dir)
    packs = executors.seed_packs([d.run.cfg for d in todo], spec.launcher.seeds_per_job)  # [[index in todo]]
    tasks = [executors.job_for_pack([todo[i].run.cfg for i in p], finished_after_ms=after_ms) for p in packs]
    names = [todo[p[0]].run.name or spec.name for p in packs]
    job_ids = [""] * len(todo)
    for p, jid in zip(packs, executors.submit(spec, tasks, names)):
        for i in p:
            job_ids[i] = jid
    db = JobsDB(spec.sweep_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    for d, jid in zip(todo, job_ids):
        prev = db.runs.get(d.run.signature, {})
        db.runs[d.run.signature] = {
            "job_id": jid, "launcher": spec.launcher.name, "name": d.run.name, "submitted": now,
            "run_dir": str(d.run.cfg.run_dir), "folder": str(executors.submitit_folder(spec)),
            "history": (prev.get("history", []) + [prev["job_id"]])[-20:] if prev.get("job_id") else [],
        }
    db.save()
    shown = sorted(set(j.split("_")[0] for j in job_ids))
    print(f"submitted {len(todo)} runs as {spec.launcher.name} job{'s' if len(shown) > 1 else ''} "
          f"{', '.join(shown)} ({time.time() - t0:.1f} s); jobs recorded in {db.path}", file=out)
    return decisions


def wait_for(spec: SweepSpec, decisions: list[Decision], poll_s: float = 5.0, out=None) -> int:
    """Block until every submitted or running run of the sweep has finished (``--wait``).

    Finished = finished in the sweep's store (:func:`finished_in_store`). A job that is over without
    that has failed: the number of such runs is returned (0 = all finished), with the job's last error line.
    """
    from harness.launch import executors

    out = sys.stdout if out is None else out
    pending = {d.run.signature: d.run for d in decisions if d.action in ("submit", "running")}
    total, failed, t0 = len(pending), 0, time.time()
    while pending:
        time.sleep(poll_s)
        db = JobsDB(spec.sweep_dir)
        states = executors.job_states([db.runs[s] for s in pending if s in db.runs])
        done = finished_in_store(spec, list(pending.values()))
        for sig, run in list(pending.items()):
            if sig in done:
                del pending[sig]
                print(f"[{total - len(pending)}/{total}] {run.name or spec.name} ({sig}) finished "
                      f"({time.time() - t0:.0f} s)", file=out, flush=True)
                continue
            st = states.get(str(db.runs.get(sig, {}).get("job_id", "")))
            if st is not None and not st.alive and st.state in ("DONE", "FAILED", "LOST", "COMPLETED"):
                if sig in finished_in_store(spec, [run]):
                    continue  # finished between the two looks
                del pending[sig]
                failed += 1
                print(f"[{total - len(pending)}/{total}] {run.name or spec.name} ({sig}) FAILED: {st.state} "
                      f"{st.detail}", file=out, flush=True)
    return failed


# ----------------------------------------------------------------------------------------- CLI
def split_args(argv: list[str], flags: tuple[str, ...], usage: str) -> tuple[str, list[str], set[str]]:
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        raise SystemExit(0)
    opts = {a for a in argv if a.startswith("--")}
    unknown = sorted(opts - set(flags))
    if unknown:
        raise SweepError(f"unknown option {unknown[0]}\n{usage}")
    pos = [a for a in argv if not a.startswith("--")]
    if not pos or "=" in pos[0]:
        raise SweepError(f"the first argument must be a sweep spec (sweeps/*.yaml)\n{usage}")
    return pos[0], pos[1:], opts


def cli(body: Callable[[], int]) -> int:
    """Run a launch command: an invalid spec exits 2, a failed submission 1, each with one line; a reader
    that stops early (``| head``) ends the command quietly, as Unix tools do."""
    from harness.launch.executors import SubmissionError

    try:
        code = body()
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not as a traceback at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SubmissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        path, overrides, opts = split_args(argv, ("--rerun", "--dry-run", "--wait"), USAGE)
        spec = load_spec(path, overrides)
        if spec.tune is not None:
            raise SweepError(f"{path} is an Optuna study (it has a `tune:` block): run python -m harness.tune {path}")
        decisions = submit_sweep(spec, rerun="--rerun" in opts, dry_run="--dry-run" in opts)
        if "--wait" in opts and "--dry-run" not in opts:
            return 1 if wait_for(spec, decisions) else 0
        return 0

    return cli(body)
