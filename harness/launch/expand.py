"""A sweep's runs: ``expand`` (variants x grid x seeds -> planned runs), ``build_run`` (one run's
``RunConfig``: composed, validated, its store and folder pinned by the sweep) and ``validate`` (every
run built before anything is submitted; one bad value -> one ``SweepError`` naming the run and the key;
each run's backend checks the launcher gives it what it needs: ``harness.backends``).
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Optional

from harness import backends
from harness.spec import ConfigError, RunConfig, build, compose
from harness.launch.spec import SweepError, SweepSpec, hydra_value
from harness.uri import mlflow_uri, resolve_tracking_uri


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
            ovs = [f"{k}={hydra_value(v)}" for k, v in chosen]
            shown = [f"{k}={hydra_value(v)}" for k, v in chosen if k in varying]
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


def build_run(spec: SweepSpec, overrides: list[str], name: str = "", varying: str | None = None) -> RunConfig:
    """Compose + validate one run; tracking and out_dir come from the sweep (not identity keys). Its MLflow run's
    name: ``name`` if given (a tune trial's), else, with ``varying`` (a planned run's keys that vary across the
    sweep), :func:`sweep_run_name`."""
    data = compose(run_overrides(spec) + list(overrides))
    data.setdefault("tracking", {})
    data["tracking"]["experiment"] = spec.experiment
    # pinned: every job logs to the store the sweep checked (tracking_uri > $MLFLOW_TRACKING_URI > project);
    # an http store's credentials travel in the environment the jobs inherit, not in their pickled spec
    data["tracking"]["uri"] = mlflow_uri(resolve_tracking_uri(spec.tracking_uri or data["tracking"].get("uri")))
    data["tracking"]["run_name"] = name or None
    data["out_dir"] = None
    cfg = build(data)
    cfg.out_dir = str(spec.runs_dir / spec.experiment / cfg.signature)  # not an identity key
    if not name and varying is not None:
        cfg.tracking.run_name = sweep_run_name(cfg, varying)  # not an identity key either
    return cfg


def sweep_run_name(cfg: RunConfig, varying: str) -> str:
    """A sweep run's MLflow name: what it trains (``harness.tracking.run_name``: the estimator's label and the seed)
    and the other keys that vary across the sweep, e.g. ``mean_n(n=8) s3 task=addition``."""
    from harness.tracking import run_name

    rest = [kv for kv in varying.split() if not kv.startswith(("estimator=", "estimator.", "seed="))]
    return " ".join([run_name(cfg), *rest])


def validate(spec: SweepSpec, runs: list[PlannedRun] | None = None) -> list[PlannedRun]:
    """Build every run; raise one SweepError listing every bad run (with its key) if any is invalid."""
    runs = expand(spec) if runs is None else runs
    if not runs:
        raise SweepError(f"sweep {spec.name}: expands to no runs")
    errors: list[tuple[PlannedRun, ConfigError]] = []
    for r in runs:
        try:
            r.cfg = build_run(spec, r.overrides, varying=r.name)
        except ConfigError as exc:
            errors.append((r, exc))
    if errors:
        lines = error_lines(errors, len(runs))
        raise SweepError(f"sweep {spec.name}: {len(errors)} of {len(runs)} runs invalid, nothing submitted:\n  "
                         + "\n  ".join(lines), key=errors[0][1].key)
    # launcher vs runs: each run's backend says what it needs
    for r in runs:
        problem = backends.get(r.cfg.backend.name).launcher_problem(r.cfg, spec.launcher, r.label)
        if problem is not None:
            key, message = problem
            raise SweepError(message, key=key)
    return dedupe(runs)


def error_lines(errors: list[tuple[PlannedRun, ConfigError]], total: int, most: int = 10) -> list[str]:
    """One line per distinct error: a message every run shares is said once (a bad key in ``base``: ``all 26 runs:
    trainer.lrr: unknown key ...``), one some runs share names the first with the count of the others; at most
    ``most`` lines."""
    by_message: dict[str, list[PlannedRun]] = {}
    for r, exc in errors:
        by_message.setdefault(str(exc), []).append(r)
    lines = []
    for message, rs in by_message.items():
        if len(rs) == total > 1:
            lines.append(f"all {total} runs: {message}")
        else:
            more = len(rs) - 1
            lines.append(f"{rs[0].label}: {message}" + (f" (the same for {more} more run{'s' * (more > 1)})" if more else ""))
    if len(lines) > most:
        lines = lines[:most] + [f"... and {len(lines) - most} more distinct errors"]
    return lines


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
