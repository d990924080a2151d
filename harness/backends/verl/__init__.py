"""The verl backend: the same estimators in verl (+ vLLM rollout) on GPU clusters.

    command(cfg)          -> argv of ``env ... python -m verl.trainer.main_ppo <overrides>`` (--dry-run)
    print_plan(cfg)       -> the per-GPU memory estimate (--plan; memory.py)
    train(cfg, tracker)   -> runs it for real: GPU/vLLM/data checks, the MLflow run (tags, spec,
                             resume), then verl as a subprocess; multi-node runs through launch.py

verl's legacy trainer runs (``trainer.use_v1=false``; docs/verl.md, "Which trainer").
Modules: config (VerlConfig, validate), translate (spec -> overrides), plugins (our code inside
verl's workers: mean_n and deterministic agent loops, rais loss + FSDP router patch, MLflow hook),
memory (--plan), metrics (verl names -> ours), launch
(Ray on Slurm), data/reward (prepared datasets). See docs/verl.md. Importing this package imports
neither verl nor harness.config (harness.config imports VerlConfig from here).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import RunConfig
    from harness.tracking import Tracker

__all__ = ["command", "train", "print_plan"]


def command(cfg: "RunConfig") -> list[str]:
    """argv of the verl run (``shlex.join`` it to paste); what ``--dry-run`` prints."""
    from harness.backends.verl.runner import command as _command

    return _command(cfg)


def train(cfg: "RunConfig", tracker: "Tracker | None" = None) -> None:
    """Run verl for ``cfg``; raises ``runner.VerlUnavailable`` (a ConfigError) where it cannot run."""
    from harness.backends.verl.runner import train as _train

    _train(cfg, tracker)


def print_plan(cfg: "RunConfig") -> int:
    """``--plan``: validate, print the per-GPU memory estimate; exit status 0 if it fits, else 1."""
    from harness.backends.verl.config import validate
    from harness.backends.verl.memory import plan

    validate(cfg)
    p = plan(cfg)
    print(p.text())
    return 0 if p.fits else 1
