"""The verl backend: the same estimators in verl (+ vLLM rollout) on GPU clusters.

``BACKEND`` declares it to the registry (``harness.backends``):

    validate(cfg)         -> the verl checks (config.validate: GPUs, batch sizes, tasks, estimator mapping)
    command(cfg)          -> argv of ``env ... python -m verl.trainer.main_ppo <overrides>`` (--dry-run)
    print_plan(cfg)       -> the per-GPU memory estimate (--plan; memory.py)
    job(cfg)              -> the launcher's per-node job (launch.VerlJob: Ray head + workers)
    run(cfg, rerun) / train(cfg, tracker) -> runs it for real: GPU/vLLM/data checks, the run folder's identity
                             (harness.record), the MLflow run (tags, spec, resume), then verl as a subprocess;
                             multi-node runs through launch.py

verl's legacy trainer runs (``trainer.use_v1=false``; docs/verl.md, "Which trainer").
Modules: config (VerlConfig, validate), translate (spec -> overrides), plugins (our code inside
verl's workers: mean_n and deterministic agent loops, rais loss + FSDP router patch, MLflow hook),
memory (--plan), metrics (verl names -> ours), launch
(Ray on Slurm), data/reward (prepared datasets). See docs/verl.md. Importing this package imports
neither verl nor harness.spec (the spec's ``verl`` section, VerlConfig, is declared here as ``BACKEND.section``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from harness.backends import Backend
from harness.backends.verl.config import VerlConfig

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig
    from harness.tracking import Tracker

__all__ = ["BACKEND", "validate", "command", "train", "run", "job", "print_plan"]


def validate(cfg: "RunConfig") -> None:
    """The verl checks (``harness.backends.verl.config.validate``)."""
    from harness.backends.verl.config import validate as _validate

    _validate(cfg)


def command(cfg: "RunConfig") -> list[str]:
    """argv of the verl run (``shlex.join`` it to paste); what ``--dry-run`` prints."""
    from harness.backends.verl.runner import command as _command

    return _command(cfg)


def train(cfg: "RunConfig", tracker: "Tracker | None" = None, rerun: bool = False,
          finished_after_ms: int = 0) -> dict[str, Any]:
    """Run verl for ``cfg`` (``runner.train``); raises ``runner.VerlUnavailable`` (a ConfigError) where it
    cannot run, ``harness.record.IdentityError`` for a run folder of another run."""
    from harness.backends.verl.runner import train as _train

    return _train(cfg, tracker, rerun=rerun, finished_after_ms=finished_after_ms)


def print_plan(cfg: "RunConfig") -> int:
    """``--plan``: validate, print the per-GPU memory estimate; exit status 0 if it fits, else 1."""
    from harness.backends.verl.config import validate
    from harness.backends.verl.memory import plan

    validate(cfg)
    p = plan(cfg)
    print(p.text())
    return 0 if p.fits else 1


def run(cfg: "RunConfig", rerun: bool = False) -> None:
    """``python -m harness.run`` on this machine: ``train`` (its summary is the folder's ``summary.json``, not a
    ``RunSummary``). ``rerun``: the folder's ``summary.json``, ``mlflow_run_id``, ``git_commit`` and
    ``verl_checkpoints/`` are set aside (``*.prev-<time>``) and the run starts from scratch in a new MLflow run."""
    train(cfg, rerun=rerun)


def job(cfg: "RunConfig", finished_after_ms: int = 0):
    """The launcher's job: one task per node (``harness.backends.verl.launch.VerlJob``)."""
    from harness.backends.verl.launch import VerlJob

    return VerlJob(cfg.to_dict())


def finished(client: Any, cfg: "RunConfig", after_ms: int = 0) -> Optional[dict[str, Any]]:
    """The folder's result if it answers ``cfg`` in ``client``'s store (``runner.finished``), else None."""
    from harness.backends.verl.runner import finished as _finished

    return _finished(client, cfg, after_ms)


# the verl run's own files in its folder (runner.RUN_FILES; this package does not import the runner: tested equal)
RUN_FILES = ("mlflow_run_id", "git_commit", "verl_checkpoints")


def launcher_problem(cfg: "RunConfig", lc: Any, label: str) -> Optional[tuple[str, str]]:
    """Slurm: exactly ``verl.nnodes`` nodes x ``verl.gpus_per_node`` GPUs, one task per node; the local
    launcher: one node."""
    v = cfg.verl
    if lc.name == "slurm":
        for key, want in (("nodes", v.nnodes), ("gpus_per_node", v.gpus_per_node), ("tasks_per_node", 1)):
            if getattr(lc, key) != want:
                return (f"launcher.{key}", f"launcher.{key}: {label} is a verl run on {v.nnodes} node(s) x "
                        f"{v.gpus_per_node} GPUs (one task per node): set launcher.{key}={want}, not {getattr(lc, key)}")
    elif v.nnodes > 1:
        return "launcher", f"launcher: {label} is a verl run on {v.nnodes} nodes; use launcher=slurm"
    return None


BACKEND = Backend(name="verl", validate=validate, run=run, job=job, launcher_problem=launcher_problem,
                  command=command, plan=print_plan, finished=finished, run_files=RUN_FILES,
                  section=("verl", VerlConfig))
