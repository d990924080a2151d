"""One run: ``python -m harness.run [key=value ...] [--dry-run]``.

The spec is composed with Hydra from ``experiments/`` and validated into a ``RunConfig`` before
anything runs: a bad value prints one error naming the key and what is allowed, exits with status
2, and creates no MLflow run. Then the spec's backend (``harness.backends.get(cfg.backend.name)``)
runs it. ``execute(cfg)`` (the local backend's loop, ``harness.backends.local.run``) trains (or
resumes, from ``run_dir/checkpoint.pt``, into the same MLflow run) and returns a ``RunSummary``.
"""
from __future__ import annotations

import shlex
import sys

from harness import backends
from harness.backends.local.run import execute
from harness.errors import ConfigError, fail
from harness.summary import RunSummary, flat, summary_rewards
from harness.uri import scrub

__all__ = ["main", "usage", "execute", "RunSummary", "flat", "summary_rewards"]

USAGE = """usage: python -m harness.run [OVERRIDE ...] [--config-dir DIR] [--rerun] [--dry-run] [--print-config] [--plan]

Overrides are Hydra's key=value, e.g.
  estimator=mean_n estimator.n=8 seed=3
  estimator=tis estimator.clip_c=2 estimator.level=sequence task=addition
Groups (options: the YAML files in experiments/<group>/, and in your own config folders):
{groups}
--config-dir    a folder of your own configs (estimator/mine.yaml, config.yaml, ...), searched before the shipped
                ones; repeatable. An experiments/ folder in the working directory is searched too.
--rerun         train again although the run is finished in the store (old folder files kept as *.prev-<time>)
--dry-run       validate, print the resolved spec (backend=verl: the verl command) and stop
--print-config  print the resolved spec as YAML and stop
--plan          backend=verl: print the per-GPU memory estimate (weights, grads, optimizer, activations)

A run is finished when its store (tracking.uri > $MLFLOW_TRACKING_URI > <project>/mlruns.db) holds a
FINISHED run of its signature and seed; then it trains nothing and prints "already finished in <store>
(run <id>), not retrained" with that result. MLflow names a run for what it trains (mean_n(n=8) s3).
Exit status: 0 done, 2 bad input (spec, folder, checkpoint, a deleted experiment) or the run in progress in
another process, 1 store unreachable, locked past 120 s or full, or a run file not written (disk full), 3 diverged,
130/143 interrupted (SIGINT/SIGTERM: the MLflow run ends KILLED, a checkpoint resumes it)."""


def usage(dirs: list | None = None) -> str:
    """USAGE with each config group's options, read from ``<config dir>/<group>/*.yaml``."""
    from harness.spec import GROUPS, group_options

    return USAGE.format(groups="\n".join(f"  {g:10s} {', '.join(group_options(g, dirs))}" for g in GROUPS))


def config_dir_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(argv without the --config-dir options, their folders)``: ``--config-dir DIR`` or ``--config-dir=DIR``."""
    rest, dirs, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--config-dir":
            if i + 1 >= len(argv):
                raise ConfigError("--config-dir", "needs a folder: --config-dir DIR")
            dirs.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--config-dir="):
            dirs.append(a.partition("=")[2])
        else:
            rest.append(a)
        i += 1
    return rest, dirs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from harness.spec import config_dirs, load

    try:
        argv, extra = config_dir_args(argv)
        dirs = config_dirs(extra)
    except ConfigError as exc:
        return fail(exc, 2)
    if any(a in ("-h", "--help") for a in argv):
        print(usage(dirs))
        return 0
    dry = "--dry-run" in argv
    show = "--print-config" in argv
    flags = [a for a in argv if a.startswith("--")]
    unknown = [f for f in flags if f not in ("--dry-run", "--print-config", "--plan", "--rerun")]
    if unknown:
        print(f"error: unknown option {unknown[0]}\n{usage(dirs)}", file=sys.stderr)
        return 2
    overrides = [a for a in argv if not a.startswith("--")]
    try:
        cfg = load(overrides, dirs=dirs)
        backend = backends.get(cfg.backend.name)
        if "--plan" in argv:  # the backend's resource estimate (verl: per-GPU memory, harness/backends/verl/memory.py)
            if backend.plan is None:
                raise ConfigError("backend", "--plan estimates GPU memory of a verl spec; use it with backend=verl")
            return backend.plan(cfg)
        if dry and backend.command is not None:
            print(scrub(shlex.join(backend.command(cfg)), cfg.tracking_uri))  # a database URL's password: not shown
            return 0
    except ConfigError as exc:
        return fail(exc, 2)
    if dry or show:
        import yaml

        print(yaml.safe_dump(cfg.public_dict(), sort_keys=False), end="")
        print(f"# signature: {cfg.signature}")
        return 0
    from harness.record import (CheckpointError, IdentityError, Interrupted, RunFolderError, RunInProgress,
                                RunWriteError, signals_as_interrupts)
    from harness.tracking import TrackingError

    try:
        with signals_as_interrupts():
            summary = backend.run(cfg, rerun="--rerun" in argv)
            if summary is None:  # the backend wrote its result itself (verl)
                return 0
    except (ConfigError, IdentityError, CheckpointError, RunFolderError, RunInProgress) as exc:
        return fail(exc, 2)
    except (TrackingError, RunWriteError) as exc:  # the store (unreachable, locked, full), a file not written
        return fail(exc, 1)
    except Interrupted as exc:
        print(f"interrupted ({exc})", file=sys.stderr)
        return 128 + exc.signum
    print(summary.line(cfg))
    return 0 if summary.status != "diverged" else 3


if __name__ == "__main__":
    raise SystemExit(main())
