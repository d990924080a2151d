"""The local backend: a small Qwen3-MoE-style policy trained with GRPO/PPO in plain PyTorch.

``BACKEND`` declares it to the registry (``harness.backends``): validate (the tasks it generates, no
checkpoint path), run (``run.execute``, this process), a job per run or per seed pack (``jobs``), and
no command of its own. Importing this package imports neither torch nor ``harness.spec``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from harness.backends import Backend
from harness.backends.local.identity import markers

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig


def validate(cfg: "RunConfig") -> None:
    """The local backend runs the tasks that declare it (``harness.tasks.names("local")``: generated ones)
    and builds its model from the config (no checkpoint path); the prefix cache's knobs need a multi-turn task,
    and ``replay_on_miss`` a cache that can miss (capacity < 1)."""
    from harness import tasks
    from harness.errors import ConfigError

    t, m = cfg.task, cfg.model
    allowed = tasks.names("local")
    if t.name not in allowed:
        raise ConfigError("task", f"unknown value {t.name!r}; allowed: {', '.join(allowed)}")
    i = cfg.inference
    if tasks.get(t.name).tool is None:  # a single-turn rollout has no turns to cache between
        for key, off in (("prefix_cache_capacity", 1.0), ("replay_on_miss", "recompute")):
            if getattr(i, key) != off:
                multi = [n for n in allowed if tasks.get(n).tool is not None]
                raise ConfigError(f"inference.{key}", f"the prefix cache between turns needs a multi-turn task "
                                  f"({', '.join(multi)}); task {t.name} is single-turn: leave it {off}")
    elif i.replay_on_miss == "missing" and i.prefix_cache_capacity >= 1.0:  # a no-op under a new signature
        raise ConfigError("inference.replay_on_miss", f"{i.replay_on_miss!r} is what a prefix-cache miss replays, but "
                          "inference.prefix_cache_capacity=1.0 never evicts: set a capacity < 1 or leave it recompute")
    if m.path is not None:
        raise ConfigError("model.path", f"a checkpoint path is for backend=verl; the local backend builds {m.name} "
                                        "from its config")


def run(cfg: "RunConfig", rerun: bool = False, **kwargs: Any):
    """Train ``cfg`` here (``harness.backends.local.run.execute``): its ``RunSummary``."""
    from harness.backends.local.run import execute

    return execute(cfg, rerun=rerun, **kwargs)


def job(cfg: "RunConfig", finished_after_ms: int = 0):
    from harness.backends.local.jobs import RunJob

    return RunJob(cfg.to_dict(), finished_after_ms=finished_after_ms)


def pack(cfgs: list, finished_after_ms: int = 0):
    from harness.backends.local.jobs import PackJob

    return PackJob([c.to_dict() for c in cfgs], finished_after_ms)


def launcher_problem(cfg: "RunConfig", lc: Any, label: str) -> Optional[tuple[str, str]]:
    """One task on one node, enough CPUs for ``backend.threads``, a GPU where it runs on cuda."""
    if lc.nodes != 1 or lc.tasks_per_node != 1:
        return ("launcher.nodes" if lc.nodes != 1 else "launcher.tasks_per_node",
                f"launcher.nodes: {label} runs on the local backend: one task on one node "
                f"(launcher.nodes=1, launcher.tasks_per_node=1), not {lc.nodes} x {lc.tasks_per_node}")
    if cfg.backend.threads > lc.cpus_per_task * max(1, lc.tasks_per_node):
        return ("launcher.cpus_per_task",
                f"launcher.cpus_per_task: {lc.cpus_per_task} CPUs per job but {label} uses "
                f"backend.threads={cfg.backend.threads}; raise launcher.cpus_per_task or lower backend.threads")
    if cfg.trainer.overlap and lc.seeds_per_job > 1:
        return ("launcher.seeds_per_job",
                f"launcher.seeds_per_job: {label} has trainer.overlap=true (a rollout process per run); seed packs "
                f"cannot overlap: set launcher.seeds_per_job=1 (got {lc.seeds_per_job}) or trainer.overlap=false")
    if cfg.trainer.overlap and lc.name == "slurm" and lc.cpus_per_task < 2 * cfg.backend.threads:
        return ("launcher.cpus_per_task",
                f"launcher.cpus_per_task: {label} has trainer.overlap=true: two processes of backend.threads="
                f"{cfg.backend.threads} each; give each job >= {2 * cfg.backend.threads} CPUs")
    if cfg.backend.device == "cuda" and lc.name == "slurm" and lc.gpus_per_node < 1:
        return "launcher.gpus_per_node", f"launcher.gpus_per_node: {label} runs on cuda but the jobs ask for no GPU"
    return None


BACKEND = Backend(name="local", validate=validate, run=run, job=job, pack=pack, launcher_problem=launcher_problem,
                  prunable=True, identity=markers)
