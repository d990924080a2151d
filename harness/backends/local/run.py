"""The local backend's training loop: ``execute(cfg)`` trains (or resumes, from ``run_dir/checkpoint.pt``,
into the same MLflow run, or returns the finished result of) one run and returns its ``RunSummary``.
``python -m harness.run`` and the launchers' jobs call it (through ``harness.backends.get("local").run``).
"""
from __future__ import annotations

import math
import time
from typing import Callable

from harness.spec import RunConfig
from harness.errors import ConfigError
from harness.summary import RunSummary, flat
from harness.tags import run_tags


def device_of(cfg: RunConfig):
    import torch

    if cfg.backend.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.backend.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend.device", "cuda requested but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(cfg.backend.device)


def start(record, warmstart: dict) -> tuple:
    """Start (or, resumed, reopen) ``record``'s MLflow run with the run's tags, its params (the flat spec and
    the warm start's steps and reward) and its spec as YAML: ``(tracker, last step already logged, -1 if none)``.
    A run alone (:func:`execute`) and every seed of a pack (``pack.py``) start the same way."""
    import yaml

    from harness import metrics as M

    from harness import numerics

    cfg = record.cfg
    fp = numerics.fingerprint(str(device_of(cfg)))  # what the run's bits depend on (docs/reliability.md)
    tags = {**run_tags(cfg), "numerics.key": fp["key"], "numerics.cpu": fp["cpu"]}
    shown = cfg.public_dict()  # tracking.uri without its credentials (harness.uri.redact)
    tracker = record.start(tags, {**flat(shown), "warmstart.steps": warmstart["steps"],
                                  "warmstart.reward": warmstart["reward"]},
                           yaml.safe_dump(shown, sort_keys=False))
    return tracker, (tracker.last_logged_step(M.REWARD_MEAN) if record.state is not None else -1)


def execute(cfg: RunConfig, on_step: Callable[[int, dict[str, float]], bool] | None = None, rerun: bool = False,
            tags: dict[str, str] | None = None, progress: bool = True, finished_after_ms: int = 0) -> RunSummary:
    """Train (or resume, or return the finished result of) the run ``cfg``.

    The bookkeeping (identity of folder, checkpoint and summary; the store lookup; the MLflow run's
    start and end; checkpoints) is :class:`harness.record.RunRecord`'s; this is the training loop.
    ``rerun``: set the folder's files aside and train again even if the store has it finished;
    ``finished_after_ms``: only a FINISHED run started at or after this time counts (a sweep's --rerun).
    """
    from harness import numerics
    from harness.record import RunRecord

    numerics.pin()  # before torch's first operator, a checkpoint's load included (harness/numerics.py)
    record = RunRecord(cfg, rerun=rerun, finished_after_ms=finished_after_ms, tags=tags)
    done = record.prepare()  # store, folder lock, identity, store lookup, checkpoint: seconds, before the warm start
    if done is not None:
        return done
    try:
        return _train(record, on_step, progress)
    finally:
        record.release()  # the folder's lock, however the run ended


def _train(record, on_step: Callable[[int, dict[str, float]], bool] | None, progress: bool) -> RunSummary:
    """The training loop of :func:`execute`, for a prepared ``record`` (its folder locked)."""
    import torch
    from tqdm import tqdm

    from harness import metrics as M
    from harness.backends.local.overlap import make_trainer
    from harness.backends.local.trainer import StepAborted
    from harness.record import Interrupted
    from harness.tracking import StepBuffer

    cfg = record.cfg
    torch.set_num_threads(cfg.backend.threads)
    torch.manual_seed(cfg.seed)
    device = device_of(cfg)

    trainer = make_trainer(cfg, device)  # with trainer.overlap, it holds a rollout process: closed below
    try:
        state = record.state
        if state is not None:
            trainer.load_state_dict(state["trainer"])
            rewards = state["rewards"]
        else:
            rewards = []
        tracker, logged = start(record, trainer.warmstart)
    except BaseException:
        trainer.close()
        raise

    buffer = StepBuffer(tracker)
    trainer.stop_check = lambda: record.stop_signal is not None  # a signal stops the step at its next phase
    saved = [trainer.step if state is not None else None]  # the step of the last checkpoint

    def save_checkpoint() -> None:
        buffer.flush()  # every step up to a checkpoint is in the store
        record.save_checkpoint(trainer.state_dict(), {"rewards": rewards})
        saved[0] = trainer.step

    status, times = "finished", []
    bar = tqdm(total=cfg.trainer.steps, initial=trainer.step, desc=cfg.estimator.name, disable=not progress,
               dynamic_ncols=True, leave=False)
    try:
        with record.loop():
            while trainer.step < cfg.trainer.steps:
                step = trainer.step
                try:
                    values = trainer.run_step()
                except StepAborted:  # a signal mid-step: the last checkpoint is the run's state, not this memory
                    where = (f"its state is checkpoint {record.checkpoint_path} at step {saved[0]}" if saved[0] is not
                             None else "no checkpoint yet: a rerun starts over")
                    after = time.monotonic() - (record.stop_time or time.monotonic())
                    raise Interrupted(record.stop_signal, f"MLflow run {tracker.run_id} ended KILLED during step "
                                      f"{step}, stopped {after:.2f} s after the signal; {where} (the same command "
                                      "resumes, recomputing the steps since bitwise)") from None
                rewards.append(values[M.REWARD_MEAN])
                times.append(values[M.TIME_STEP])
                if step > logged:  # a resumed run recomputes identical steps; log each once
                    buffer.add(step, values)
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
        buffer.flush_on_failure()
        record.end(exc)
        raise
    finally:
        bar.close()
        trainer.close()

    try:
        buffer.flush()
        summary = RunSummary.of(tracker.run_id, cfg, status, trainer.step, rewards, times)
    except BaseException as exc:
        record.end(exc)
        raise
    record.finish(summary, summary.metrics())
    return summary
