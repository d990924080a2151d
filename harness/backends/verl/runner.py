"""Running verl for one spec: preflight checks, the MLflow run, the ``main_ppo`` subprocess."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import TYPE_CHECKING, Any

from harness.config import ConfigError, RunConfig
from harness.backends.verl import data, translate
from harness.provenance import git_commit
from harness.tags import run_tags
from harness.backends.verl.config import validate

if TYPE_CHECKING:  # pragma: no cover
    from harness.tracking import Tracker

RUN_ID_FILE = "mlflow_run_id"
SUMMARY_FILE = "summary.json"
COMMIT_FILE = "git_commit"


class VerlUnavailable(ConfigError):
    """This machine cannot run verl (no GPU, no vLLM, missing data): raised before anything starts."""

    def __init__(self, message: str):
        super().__init__("backend", message)


def command(cfg: RunConfig) -> list[str]:
    """The exact command ``train`` runs (less the MLflow run id it only knows at run time).

    Validates first: an invalid combination (R3 on FSDP, ...) raises ConfigError, whoever calls."""
    validate(cfg)
    return translate.command(cfg)


#: packages the chosen verl path imports on the GPU nodes: (module, distribution, why). The legacy
#: trainer (``trainer.use_v1=false``, the only one we run) needs no TransferQueue; ``pip install
#: -e .[cluster]`` (pyproject.toml) installs all of them with the versions verl 0.9.1 pins.
#: (vLLM itself is imported, not just found: a broken CUDA install fails at import)
PACKAGES_ALWAYS = (("ray", "ray", "verl's single controller"),)
PACKAGES_BY_STRATEGY = {
    "megatron": (("megatron.core", "megatron-core", "the megatron engine"),
                 ("mbridge", "mbridge", "verl's HF <-> megatron weight bridge (use_mbridge)"),
                 ("megatron.bridge", "megatron-bridge", "verl's megatron model providers"),
                 ("transformer_engine", "transformer-engine", "megatron's fused layers")),
    "fsdp": (("flash_attn", "flash-attn", "attn_implementation=flash_attention_2 (verl's default)"),),
    "fsdp2": (("flash_attn", "flash-attn", "attn_implementation=flash_attention_2 (verl's default)"),),
}


def required_packages(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """(module, distribution, why) of every package the spec's verl path imports (not vLLM's own deps)."""
    return [*PACKAGES_ALWAYS, *PACKAGES_BY_STRATEGY[cfg.verl.strategy]]


def missing_packages(cfg: RunConfig) -> list[str]:
    import importlib.util

    out = []
    for module, dist, why in required_packages(cfg):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing
            found = False
        if not found:
            out.append(f"{dist} ({why})")
    return out


def preflight(cfg: RunConfig) -> None:
    """Everything a verl run needs on this machine, checked before an MLflow run or a job exists."""
    problems = []
    missing = missing_packages(cfg)
    if missing:
        problems.append(f"verl's {cfg.verl.trainer} trainer with verl.strategy={cfg.verl.strategy} needs "
                        f"{', '.join(missing)}: pip install -e '.[cluster]'")
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a CUDA/driver error at import)
        problems.append(f"vLLM is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        gpus = 0
    if gpus == 0:
        problems.append("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    elif gpus < cfg.verl.gpus_per_node:
        problems.append(f"{gpus} GPUs visible, the spec asks for verl.gpus_per_node={cfg.verl.gpus_per_node}")
    if cfg.verl.nnodes > 1 and not os.environ.get("RAY_ADDRESS"):
        problems.append(f"verl.nnodes={cfg.verl.nnodes}: a multi-node run starts inside a Slurm allocation "
                        "(python -m harness.sweep ... launcher=slurm, or the script of "
                        "harness.backends.verl.launch.sbatch_script)")
    train_files, val_files = translate.data_files(cfg)
    for f in (train_files, val_files):
        if not os.path.exists(os.path.expanduser(f)):
            problems.append(f"data file {f} is missing: prepare it with "
                            f"`{data.command(cfg.task.name, cfg.task.length, cfg.verl.data.root)}` (see docs/verl.md)")
    tools = translate.tools_file(cfg)
    if tools is not None and not os.path.exists(tools):
        problems.append(f"verl.tools file {tools} is missing")
    path = cfg.model.path or ""
    if path.startswith(("/", ".", "~")) and not os.path.exists(os.path.expanduser(path)):
        problems.append(f"model.path {path} does not exist")  # a Hub id (org/name) is fetched by verl
    if problems:
        raise VerlUnavailable("cannot run verl on this machine: " + "; ".join(problems) +
                              ". verl runs need GPU nodes with vLLM; `--dry-run` prints the command")


def _tracker(cfg: RunConfig, commit: str) -> "Tracker":
    """This run's MLflow run: created once (tags, params, spec), re-attached on every requeue."""
    import yaml

    from harness.tracking import Tracker

    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    id_file = cfg.run_dir / RUN_ID_FILE
    if id_file.exists():
        return Tracker(cfg.tracking_uri, cfg.tracking.experiment, run_id=id_file.read_text().strip())
    tracker = Tracker(cfg.tracking_uri, cfg.tracking.experiment, run_name=translate.run_name(cfg),
                      tags=run_tags(cfg, commit))
    spec = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    tracker.log_text(spec, "spec.yaml")
    tracker.log_text(shlex.join(translate.command(cfg, commit=commit)), "verl_command.txt")
    id_file.write_text(tracker.run_id + "\n")
    return tracker


def train(cfg: RunConfig, tracker: "Tracker | None" = None) -> None:
    """Run verl for this spec (resuming it if it ran before); raises VerlUnavailable off a GPU node."""
    validate(cfg)
    summary = cfg.run_dir / SUMMARY_FILE
    if summary.exists():
        return
    preflight(cfg)
    # verl logs its whole config as MLflow params, and MLflow refuses a param whose value changes:
    # a requeued job must send the same config, so the commit is pinned at the first launch
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    commit_file = cfg.run_dir / COMMIT_FILE
    if not commit_file.exists():
        commit_file.write_text(git_commit() + "\n")
    commit = commit_file.read_text().strip()
    tracker = tracker or _tracker(cfg, commit)
    if not (cfg.run_dir / RUN_ID_FILE).exists():  # a caller's tracker: requeued jobs must find it too
        (cfg.run_dir / RUN_ID_FILE).write_text(tracker.run_id + "\n")
    env = {**translate.environment(cfg), "MLFLOW_RUN_ID": tracker.run_id}
    argv = translate.command(cfg, commit=commit, env=env)
    if os.environ.get("SLURM_CPUS_PER_TASK") and not os.environ.get("RAY_ADDRESS"):
        # a single-node job starts Ray itself: give it the CPUs Slurm allotted, not the node's count
        argv.append(f"ray_kwargs.ray_init.num_cpus={int(os.environ['SLURM_CPUS_PER_TASK'])}")
    print(f"[harness] MLflow run {tracker.run_id}; running: {shlex.join(argv)}", flush=True)
    proc = subprocess.run(argv, env={**os.environ, **env})
    if proc.returncode != 0:
        tracker.set_tags({"status": "failed"})
        raise RuntimeError(f"verl exited with status {proc.returncode} (MLflow run {tracker.run_id})")
    tracker.set_tags({"status": "finished"})
    summary.write_text(json.dumps({"run_id": tracker.run_id, "signature": cfg.signature, "status": "finished"}) + "\n")


def summary(cfg: RunConfig) -> dict[str, Any] | None:
    path = cfg.run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else None
