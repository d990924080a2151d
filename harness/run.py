"""One run: ``python -m harness.run [key=value ...] [--dry-run]``.

The spec is composed with Hydra from ``experiments/`` and validated into a ``RunConfig`` before
anything runs: a bad value prints one error naming the key and what is allowed, exits with status
2, and creates no MLflow run. ``execute(cfg)`` is the API the launchers call: it trains (or
resumes, from ``run_dir/checkpoint.pt``, into the same MLflow run) and returns a ``RunSummary``.
"""
from __future__ import annotations

import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from harness.config import ROOT, ConfigError, RunConfig
from harness.tags import run_tags

USAGE = """usage: python -m harness.run [OVERRIDE ...] [--rerun] [--dry-run] [--print-config] [--plan]

Overrides are Hydra's key=value, e.g.
  estimator=mean_n estimator.n=8 seed=3
  estimator=tis estimator.clip_c=2 estimator.level=sequence task=addition
Groups (options: the YAML files in experiments/<group>/):
{groups}
--rerun         train again although the run is finished in the store (old folder files kept as *.prev-<time>)
--dry-run       validate, print the resolved spec (backend=verl: the verl command) and stop
--print-config  print the resolved spec as YAML and stop
--plan          backend=verl: print the per-GPU memory estimate (weights, grads, optimizer, activations)

A run is finished when its store (tracking.uri > $MLFLOW_TRACKING_URI > <project>/mlruns.db) holds a
FINISHED run of its signature and seed; then it prints that result and trains nothing.
Exit status: 0 done, 2 bad input (spec, folder, checkpoint), 1 store unreachable, 3 diverged,
130/143 interrupted (SIGINT/SIGTERM: the MLflow run ends KILLED, a checkpoint resumes it)."""


def usage() -> str:
    """USAGE with each config group's options, read from ``experiments/<group>/*.yaml``."""
    from harness.config import GROUPS, group_options

    return USAGE.format(groups="\n".join(f"  {g:10s} {', '.join(group_options(g))}" for g in GROUPS))


SUMMARY_FILE = "summary.json"
CHECKPOINT_FILE = "checkpoint.pt"


@dataclass
class RunSummary:
    run_id: str
    signature: str
    status: str  # finished | diverged | pruned
    steps_done: int
    final_reward: float
    peak_reward: float
    time_per_step_s: float

    @classmethod
    def of(cls, run_id: str, cfg: RunConfig, status: str, steps_done: int, rewards: list[float],
           step_times: list[float]) -> "RunSummary":
        """The summary of a run's reward curve and step times (final/peak: ``summary_rewards``)."""
        final, peak = summary_rewards(rewards)
        return cls(run_id=run_id, signature=cfg.signature, status=status, steps_done=steps_done,
                   final_reward=final, peak_reward=peak,
                   time_per_step_s=sum(step_times) / len(step_times) if step_times else float("nan"))

    def metrics(self) -> dict[str, float]:
        """What the summary logs to its MLflow run (``summary/*``)."""
        return {"summary/final_reward": self.final_reward, "summary/peak_reward": self.peak_reward,
                "summary/time_per_step_s": self.time_per_step_s}

    def line(self, cfg: RunConfig) -> str:
        e = cfg.estimator
        knobs = ",".join(f"{k}={v}" for k, v in (("n", e.n), ("C", e.clip_c), ("level", e.level)) if v is not None)
        label = f"{e.name}({knobs})" if knobs else e.name
        return (f"{label} seed={cfg.seed} {cfg.task.name}/{cfg.model.name}: {self.status} after {self.steps_done} steps, "
                f"final reward {self.final_reward:.3f} (peak {self.peak_reward:.3f}), {self.time_per_step_s:.2f} s/step, "
                f"mlflow run {self.run_id[:8]} sig {self.signature}")


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def summary_rewards(xs: list[float]) -> tuple[float, float]:
    """``(final, peak)`` reward of a run: the report's definitions (``harness.curves``: final = mean of the
    last 10 rewards, peak = max of the centred 10-step moving average)."""
    from harness import curves

    return curves.final(xs), curves.peak(xs)[0]


def _device(cfg: RunConfig):
    import torch

    if cfg.backend.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.backend.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend.device", "cuda requested but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(cfg.backend.device)


def execute(cfg: RunConfig, on_step: Callable[[int, dict[str, float]], bool] | None = None, rerun: bool = False,
            tags: dict[str, str] | None = None, progress: bool = True, finished_after_ms: int = 0) -> RunSummary:
    """Train (or resume, or return the finished result of) the run ``cfg``.

    The bookkeeping (identity of folder, checkpoint and summary; the store lookup; the MLflow run's
    start and end; checkpoints) is :class:`harness.record.RunRecord`'s; this is the training loop.
    ``rerun``: set the folder's files aside and train again even if the store has it finished;
    ``finished_after_ms``: only a FINISHED run started at or after this time counts (a sweep's --rerun).
    """
    import torch
    import yaml
    from tqdm import tqdm

    from harness import metrics as M
    from harness.backends.local.trainer import LocalTrainer
    from harness.record import Interrupted, RunRecord

    record = RunRecord(cfg, rerun=rerun, finished_after_ms=finished_after_ms, tags=tags)
    done = record.prepare()  # store, folder, identity, store lookup, checkpoint: seconds, before the warm start
    if done is not None:
        return done
    torch.set_num_threads(cfg.backend.threads)
    torch.manual_seed(cfg.seed)
    device = _device(cfg)

    trainer = LocalTrainer(cfg, device)
    state = record.state
    if state is not None:
        trainer.load_state_dict(state["trainer"])
        rewards = state["rewards"]
    else:
        rewards = []
    tracker = record.start(run_tags(cfg), {**flat(cfg.to_dict()), "warmstart.steps": trainer.warmstart["steps"],
                                           "warmstart.reward": trainer.warmstart["reward"]},
                           yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    logged = tracker.last_logged_step(M.REWARD_MEAN) if state is not None else -1

    def save_checkpoint() -> None:
        record.save_checkpoint(trainer.state_dict(), {"rewards": rewards})

    status, times = "finished", []
    bar = tqdm(total=cfg.trainer.steps, initial=trainer.step, desc=cfg.estimator.name, disable=not progress,
               dynamic_ncols=True, leave=False)
    try:
        with record.loop():
            while trainer.step < cfg.trainer.steps:
                step = trainer.step
                values = trainer.run_step()
                rewards.append(values[M.REWARD_MEAN])
                times.append(values[M.TIME_STEP])
                if step > logged:  # a resumed run recomputes identical steps; log each once
                    tracker.log_step(step, values)
                bar.update(1)
                bar.set_postfix(reward=f"{values[M.REWARD_MEAN]:.3f}", k3=f"{values[M.MISMATCH_K3]:.1e}")
                if not math.isfinite(values[M.POLICY_LOSS]):
                    status = "diverged"
                    break
                if on_step is not None and on_step(step, values):
                    status = "pruned"
                    break
                every = cfg.trainer.checkpoint_every
                if every and (trainer.step % every == 0 or record.stop_signal is not None):
                    save_checkpoint()
                if record.stop_signal is not None:  # SIGINT/SIGTERM: stop after this step
                    where = (f"checkpoint {record.checkpoint_path} at step {trainer.step} (the same command resumes)"
                             if every else "no checkpoint (trainer.checkpoint_every=0): a rerun starts over")
                    raise Interrupted(record.stop_signal, f"MLflow run {tracker.run_id} ended KILLED; {where}")
    except BaseException as exc:
        record.end(exc)
        raise
    finally:
        bar.close()

    try:
        summary = RunSummary.of(tracker.run_id, cfg, status, trainer.step, rewards, times)
    except BaseException as exc:
        record.end(exc)
        raise
    record.finish(summary, summary.metrics())
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        return 0
    dry = "--dry-run" in argv
    show = "--print-config" in argv
    flags = [a for a in argv if a.startswith("--")]
    unknown = [f for f in flags if f not in ("--dry-run", "--print-config", "--plan", "--rerun")]
    if unknown:
        print(f"error: unknown option {unknown[0]}\n{usage()}", file=sys.stderr)
        return 2
    overrides = [a for a in argv if not a.startswith("--")]
    from harness.config import load

    try:
        cfg = load(overrides)
        if cfg.backend.name == "verl":
            from harness.backends import verl as verl_backend

            if "--plan" in argv:  # per-GPU memory estimate of the verl spec (harness/backends/verl/memory.py)
                return verl_backend.print_plan(cfg)
            if dry:
                print(shlex.join(verl_backend.command(cfg)))
                return 0
        elif "--plan" in argv:
            raise ConfigError("backend", "--plan estimates GPU memory of a verl spec; use it with backend=verl")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if dry or show:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        print(f"# signature: {cfg.signature}")
        return 0
    from harness.record import CheckpointError, IdentityError, Interrupted, RunFolderError, signals_as_interrupts
    from harness.tracking import TrackingError

    try:
        with signals_as_interrupts():
            if cfg.backend.name == "verl":
                verl_backend.train(cfg)
                return 0
            summary = execute(cfg, rerun="--rerun" in argv)
    except (ConfigError, IdentityError, CheckpointError, RunFolderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"interrupted ({exc})", file=sys.stderr)
        return 128 + exc.signum
    print(summary.line(cfg))
    return 0 if summary.status != "diverged" else 3


if __name__ == "__main__":
    raise SystemExit(main())
