"""Seed packs: train S seeds of one spec in one process (``PackTrainer``), each seed an ordinary run.

``execute_pack(cfgs)`` is ``harness.backends.local.run.execute`` for several seeds of one spec: every seed has its
own :class:`harness.record.RunRecord` (folder and its lock, identity, store lookup, MLflow run, checkpoint,
summary), exactly as if it ran alone. Seeds already finished in the store return their summary;
the others train together, resuming each from its own checkpoint (seeds checkpointed at different
steps train as separate packs, one per step). A seed that diverges is finished at once (status
``diverged``) while the others go on. Because a seed's curve is bitwise the same alone or in any
pack (``tests/backends/local/test_pack.py``), a pack changes only the wall time.

Throughput: the seeds share every kernel launch and Python step (stacked weights, batched GEMMs),
so a pack of S costs less than S runs where per-op overhead dominates (benchmarks/rollout_speed.py
measures the ratio); the sweep launcher packs ``launcher.seeds_per_job`` seeds per job. A seed's
step metrics go to MLflow in batches (every ~30 steps and before every checkpoint), not one store
write per seed and step.
"""
from __future__ import annotations

import math
from contextlib import ExitStack

from harness.spec import RunConfig


def execute_pack(cfgs: list[RunConfig], rerun: bool = False, tags: dict[str, str] | None = None,
                 finished_after_ms: int = 0) -> list:
    """Train (or resume, or return the finished results of) the runs ``cfgs`` (seeds of one spec)."""
    import torch

    from harness.record import RunRecord
    from harness.backends.local.run import device_of

    if len({c.group_signature for c in cfgs}) != 1:
        raise ValueError("a seed pack trains seeds of one spec (the same signature without the seed)")
    if cfgs[0].trainer.overlap:
        from harness.errors import ConfigError

        raise ConfigError("trainer.overlap", "one-step-off overlap runs one seed per process (its own rollout "
                                             "worker); seed packs cannot use it: launcher.seeds_per_job=1")
    from harness import numerics

    numerics.pin()  # before torch's first operator, a checkpoint's load included (harness/numerics.py)
    records = [RunRecord(c, rerun=rerun, finished_after_ms=finished_after_ms, tags=tags) for c in cfgs]
    summaries: dict[int, object] = {}
    by_step: dict[int, list[int]] = {}
    try:
        for i, rec in enumerate(records):  # every seed's folder locked before any trains (one in progress: exit 2)
            done = rec.prepare()
            if done is not None:
                summaries[i] = done
            else:
                by_step.setdefault(rec.state["trainer"]["step"] if rec.state is not None else 0, []).append(i)
        if by_step:
            torch.set_num_threads(cfgs[0].backend.threads)
            device = device_of(cfgs[0])
            for idx in by_step.values():
                summaries.update(zip(idx, _train([records[i] for i in idx], device)))
    finally:
        for rec in records:  # each seed's folder lock, however the pack ended
            rec.release()
    return [summaries[i] for i in range(len(cfgs))]


def _train(records: list, device) -> list:
    from harness import metrics as M
    from harness.backends.local.run import start
    from harness.backends.local.trainer import PackTrainer, StepAborted
    from harness.record import Interrupted
    from harness.summary import RunSummary
    from harness.tracking import StepBuffer

    cfgs = [r.cfg for r in records]
    trainer = PackTrainer(cfgs, device)
    trainer.stop_check = lambda: any(r.stop_signal is not None for r in records)  # stop at the step's next phase
    rewards: list[list[float]] = [[] for _ in records]
    for j, rec in enumerate(records):
        if rec.state is not None:
            trainer.load_seed_state(j, rec.state["trainer"])
            rewards[j] = list(rec.state["rewards"])
    started = [start(rec, ws) for rec, ws in zip(records, trainer.warmstarts)]
    trackers, logged = [t for t, _ in started], [n for _, n in started]
    buffers = [StepBuffer(t) for t in trackers]
    status = ["finished"] * len(records)
    live = list(range(len(records)))
    times: list[list[float]] = [[] for _ in records]
    summaries: list = [None] * len(records)
    steps, every = cfgs[0].trainer.steps, cfgs[0].trainer.checkpoint_every

    def finish(j: int) -> None:
        buffers[j].flush()
        s = RunSummary.of(trackers[j].run_id, cfgs[j], status[j], trainer.step, rewards[j], times[j])
        records[j].finish(s, s.metrics())
        summaries[j] = s

    try:
        with ExitStack() as loops:
            for rec in records:
                loops.enter_context(rec.loop())
            while trainer.step < steps and live:
                step = trainer.step
                try:
                    values = trainer.run_step()
                except StepAborted:  # a signal mid-step: each seed's state is its last checkpoint
                    signal = next(r.stop_signal for r in records if r.stop_signal is not None)
                    raise Interrupted(signal, f"seed pack of {len(records)} ended KILLED during step {step}; each "
                                      "seed resumes from its last checkpoint (the same command)") from None
                for j in list(live):
                    v = values[j]
                    rewards[j].append(v[M.REWARD_MEAN])
                    times[j].append(v[M.TIME_STEP] / len(records))  # the pack's step, shared by its seeds
                    if step > logged[j]:  # a resumed run recomputes identical steps; log each once
                        buffers[j].add(step, v)
                    if not math.isfinite(v[M.POLICY_LOSS]):
                        status[j] = "diverged"
                        live.remove(j)
                        finish(j)
                signal = next((r.stop_signal for r in records if r.stop_signal is not None), None)
                if every and (trainer.step % every == 0 or signal is not None):
                    for j in live:
                        buffers[j].flush()  # every step up to a checkpoint is in the store
                        records[j].save_checkpoint(trainer.seed_state(j), {"rewards": rewards[j]})
                if signal is not None:
                    raise Interrupted(signal, f"seed pack of {len(records)} ended KILLED at step {trainer.step}"
                                      + (" (checkpoints written: the same command resumes)" if every else ""))
    except BaseException as exc:
        for j in live:
            buffers[j].flush_on_failure()
            records[j].end(exc)
        raise
    for j in live:
        finish(j)
    return summaries
