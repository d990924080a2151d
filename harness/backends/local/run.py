"""The local backend's run loop, one for a run alone and for a seed pack: a run is a pack of one seed.

``execute(cfg)`` trains (or resumes, from ``run_dir/checkpoint.pt``, into the same MLflow run, or returns the
finished result of) one run and returns its ``RunSummary``; ``python -m harness.run`` and the launchers' jobs call
it (through ``harness.backends.get("local").run``). ``execute_pack(cfgs)`` does the same for S seeds of one spec in
one process (``PackTrainer``: stacked weights, batched GEMMs), the sweep launcher's ``launcher.seeds_per_job``.

Every seed has its own :class:`harness.record.RunRecord` (folder and its lock, identity, store lookup, MLflow run,
checkpoint, summary), exactly as if it ran alone. Seeds already finished in the store return their summary; the
others train together, resuming each from its own checkpoint (seeds checkpointed at different steps train as
separate packs, one per step). :class:`_Loop` is the loop of every pack: the step buffer (a seed's step metrics go
to MLflow in batches, every ~30 steps and before every checkpoint), divergence and pruning (``on_step``: that seed
is finished at once, status ``diverged`` / ``pruned``, while the others go on), the checkpoint cadence, signals
(a first SIGINT/SIGTERM stops at the next phase of the step or after it: ``harness.record.Interrupted``), the
flush on failure and the progress bar. A seed's curve is bitwise the same alone or in any pack
(``tests/backends/local/test_pack.py``): a pack changes only the wall time (``benchmarks/rollout_speed.py``).
One-step-off overlap (``trainer.overlap``, ``overlap.OverlapTrainer``) runs one seed per process: a pack refuses it.
"""
from __future__ import annotations

import math
import time
from contextlib import ExitStack
from typing import Callable

from harness.spec import RunConfig
from harness.errors import ConfigError
from harness.summary import RunSummary, flat
from harness.tags import run_tags

OnStep = Callable[[int, dict[str, float]], bool]  # (step, a seed's metrics) -> True: prune the run


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
    Every seed of a pack starts so (a run alone is a pack of one)."""
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


def execute(cfg: RunConfig, on_step: OnStep | None = None, rerun: bool = False, tags: dict[str, str] | None = None,
            progress: bool = True, finished_after_ms: int = 0) -> RunSummary:
    """Train (or resume, or return the finished result of) the run ``cfg``: a pack of one seed.

    The bookkeeping (identity of folder, checkpoint and summary; the store lookup; the MLflow run's
    start and end; checkpoints) is :class:`harness.record.RunRecord`'s; the loop is :class:`_Loop`.
    ``on_step(step, metrics)`` True: stop, status ``pruned``; ``rerun``: set the folder's files aside and train
    again even if the store has it finished; ``finished_after_ms``: only a FINISHED run started at or after this
    time counts (a sweep's --rerun).
    """
    return _execute([cfg], on_step, rerun, tags, progress, finished_after_ms)[0]


def execute_pack(cfgs: list[RunConfig], rerun: bool = False, tags: dict[str, str] | None = None,
                 finished_after_ms: int = 0) -> list:
    """Train (or resume, or return the finished results of) the runs ``cfgs`` (seeds of one spec): their
    ``RunSummary``s, in order."""
    if len({c.group_signature for c in cfgs}) != 1:
        raise ValueError("a seed pack trains seeds of one spec (the same signature without the seed)")
    if cfgs[0].trainer.overlap:
        raise ConfigError("trainer.overlap", "one-step-off overlap runs one seed per process (its own rollout "
                                             "worker); seed packs cannot use it: launcher.seeds_per_job=1")
    return _execute(cfgs, None, rerun, tags, False, finished_after_ms)


def _execute(cfgs: list[RunConfig], on_step: OnStep | None, rerun: bool, tags: dict[str, str] | None,
             progress: bool, finished_after_ms: int) -> list:
    """Prepare every seed's record (each folder locked before any trains: one in progress, exit 2), then train the
    unfinished ones, one pack per checkpointed step; every lock let go however it ended."""
    from harness import numerics
    from harness.record import RunRecord

    numerics.pin()  # before torch's first operator, a checkpoint's load included (harness/numerics.py)
    records = [RunRecord(c, rerun=rerun, finished_after_ms=finished_after_ms, tags=tags) for c in cfgs]
    summaries: dict[int, RunSummary] = {}
    by_step: dict[int, list[int]] = {}
    try:
        for i, rec in enumerate(records):  # store, folder lock, identity, store lookup, checkpoint: before torch
            done = rec.prepare()
            if done is not None:
                summaries[i] = done
            else:
                by_step.setdefault(rec.state["trainer"]["step"] if rec.state is not None else 0, []).append(i)
        for idx in by_step.values():
            summaries.update(zip(idx, _train([records[i] for i in idx], on_step, progress)))
    finally:
        for rec in records:  # each seed's folder lock, however the run ended
            rec.release()
    return [summaries[i] for i in range(len(cfgs))]


def _train(records: list, on_step: OnStep | None, progress: bool) -> list[RunSummary]:
    """Train the prepared ``records`` (seeds of one spec at one step, folders locked) as one pack."""
    import torch

    from harness import numerics
    from harness.backends.local.overlap import make_trainer

    cfg = records[0].cfg
    torch.set_num_threads(cfg.backend.threads)
    numerics.deterministic(cfg.backend.deterministic)
    torch.manual_seed(cfg.seed)
    trainer = make_trainer([r.cfg for r in records], device_of(cfg))  # with overlap, a rollout process: closed below
    try:
        return _Loop(records, trainer).run(on_step, progress)
    finally:
        trainer.close()


class _Loop:
    """The training loop of one pack (``trainer``) of seeds (``records``): each seed resumed from its record's
    checkpoint, its MLflow run started, its step metrics buffered; :meth:`run` steps to the end."""

    def __init__(self, records: list, trainer):
        from harness.tracking import StepBuffer

        self.records, self.trainer = records, trainer
        self.rewards: list[list[float]] = [[] for _ in records]
        for j, rec in enumerate(records):
            if rec.state is not None:
                trainer.load_seed_state(j, rec.state["trainer"])
                self.rewards[j] = list(rec.state["rewards"])
        started = [start(rec, ws) for rec, ws in zip(records, trainer.warmstarts)]
        self.trackers, self.logged = [t for t, _ in started], [n for _, n in started]
        self.buffers = [StepBuffer(t) for t in self.trackers]
        self.times: list[list[float]] = [[] for _ in records]
        self.live = list(range(len(records)))  # the seeds still training
        self.summaries: list = [None] * len(records)
        self.saved = trainer.step if any(r.state is not None for r in records) else None  # the last checkpoint's step
        trainer.stop_check = lambda: self.signal() is not None  # a signal stops the step at its next phase

    def signal(self) -> int | None:
        """The first stop signal any seed's record received (None: none)."""
        return next((r.stop_signal for r in self.records if r.stop_signal is not None), None)

    def run(self, on_step: OnStep | None, progress: bool) -> list[RunSummary]:
        """Step until the last step, or every seed diverged or was pruned; each seed's summary. A failure (a signal
        included) flushes what the live seeds computed and ends their MLflow runs."""
        from tqdm import tqdm

        cfg, steps = self.records[0].cfg, self.records[0].cfg.trainer.steps
        # off a terminal (a log file, a pipe) no bar at all: tqdm's disable=None (its \r frames filled logs, issue 45)
        bar = tqdm(total=steps, initial=self.trainer.step, desc=cfg.estimator.name, disable=None if progress else True,
                   dynamic_ncols=True, leave=False)
        try:
            with ExitStack() as loops:
                for rec in self.records:
                    loops.enter_context(rec.loop())
                while self.trainer.step < steps and self.live:
                    self.step(on_step, bar)
            for j in list(self.live):
                self.finish(j, "finished")
        except BaseException as exc:
            for j in self.live:
                self.buffers[j].flush_on_failure()
                self.records[j].end(exc)
            raise
        finally:
            bar.close()
        return self.summaries

    def step(self, on_step: OnStep | None, bar) -> None:
        """One step of the pack: each live seed's metrics recorded (each step logged once, a resumed run
        recomputing identical ones), diverged or pruned seeds finished; then the checkpoint cadence and signals."""
        from harness import metrics as M
        from harness.backends.local.trainer import StepAborted
        from harness.record import Interrupted

        step = self.trainer.step
        try:
            values = self.trainer.step_seeds()
        except StepAborted:  # a signal mid-step: the last checkpoint is the run's state, not this memory
            raise Interrupted(self.signal(), self.aborted(step)) from None
        for j in list(self.live):
            v = values[j]
            self.rewards[j].append(v[M.REWARD_MEAN])
            self.times[j].append(v[M.TIME_STEP] / len(self.records))  # the pack's step, shared by its seeds
            if step > self.logged[j]:
                self.buffers[j].add(step, v)
            if not math.isfinite(v[M.POLICY_LOSS]):
                self.finish(j, "diverged")
            elif on_step is not None and on_step(step, v):
                self.finish(j, "pruned")
        bar.update(1)
        bar.set_postfix(reward=f"{values[0][M.REWARD_MEAN]:.3f}", k3=f"{values[0][M.MISMATCH_K3]:.1e}")
        signal, every = self.signal(), self.records[0].cfg.trainer.checkpoint_every
        if not self.live:
            return
        if every and (self.trainer.step % every == 0 or signal is not None):
            self.checkpoint()
        if signal is not None:  # SIGINT/SIGTERM: stop after this step
            where = (f"{self.checkpoints()} at step {self.trainer.step} (the same command resumes)" if every
                     else "no checkpoint (trainer.checkpoint_every=0): a rerun starts over")
            raise Interrupted(signal, f"{self.who()} ended KILLED; {where}")

    def checkpoint(self) -> None:
        """Each live seed's checkpoint, every step up to it in the store first."""
        for j in self.live:
            self.buffers[j].flush()
            self.records[j].save_checkpoint(self.trainer.seed_state(j), {"rewards": self.rewards[j]})
        self.saved = self.trainer.step

    def finish(self, j: int, status: str) -> None:
        """Seed ``j`` is done (``status``): its steps flushed, its summary logged, its MLflow run ended FINISHED."""
        self.buffers[j].flush()
        summary = RunSummary.of(self.trackers[j].run_id, self.records[j].cfg, status, self.trainer.step,
                                self.rewards[j], self.times[j])
        self.live.remove(j)  # from here its record ends itself on a failure (RunRecord.finish)
        self.records[j].finish(summary, summary.metrics())
        self.summaries[j] = summary

    def who(self) -> str:
        """The runs a message names: ``MLflow run <id>``, or the pack and its live seeds' runs."""
        ids = [self.trackers[j].run_id for j in self.live]
        return f"MLflow run {ids[0]}" if len(self.records) == 1 else \
            f"seed pack of {len(self.records)} (MLflow runs {', '.join(ids)})"

    def checkpoints(self) -> str:
        """Where the live seeds' checkpoints are."""
        return f"checkpoint {self.records[0].checkpoint_path}" if len(self.records) == 1 else "each seed's checkpoint"

    def aborted(self, step: int) -> str:
        """The message of a step abandoned at a signal: the runs, how soon they stopped, where their state is."""
        stopped = next(r.stop_time for r in self.records if r.stop_signal is not None)
        after = time.monotonic() - (stopped or time.monotonic())
        where = (f"its state is {self.checkpoints()} at step {self.saved}" if self.saved is not None
                 else "no checkpoint yet: a rerun starts over")
        return (f"{self.who()} ended KILLED during step {step}, stopped {after:.2f} s after the signal; {where} "
                "(the same command resumes, recomputing the steps since bitwise)")
