"""Where one training step of the local backend spends its time: rollout, pi_old, update,
diagnostics, logging - and the torch ops behind them.

    python benchmarks/profile_step.py                          # default spec (experiments/config.yaml)
    python benchmarks/profile_step.py estimator=mean_n estimator.n=8 --steps 20

Builds the run's ``LocalTrainer`` (warm start from the cache), runs ``--warmup`` steps, then
``--steps`` timed steps: the medians of the trainer's own phase timers (``time/*`` metrics) and of
MLflow logging into a temporary sqlite store: what ``harness.run`` does (``StepBuffer``: whole steps
batched, flushed every ``checkpoint_every`` steps; mean per step) beside one ``log_batch`` per step
(before). Then ``torch.profiler`` over ``--profile-steps`` steps: the ops by self CPU time. One torch
thread, as a run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import metrics as M  # noqa: E402
from harness.spec import load  # noqa: E402

LOG_BATCHED = "logging (StepBuffer, mean)"
LOG_EACH = "logging (one log_batch/step)"
PHASES = {"rollout": M.TIME_ROLLOUT, "pi_old (estimator)": M.TIME_OLD_LOGPROB, "diagnostics": M.TIME_DIAGNOSTICS,
          "update": M.TIME_UPDATE}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. estimator=mean_n estimator.n=8")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--profile-steps", type=int, default=3, help="steps under torch.profiler (0 = skip)")
    ap.add_argument("--rows", type=int, default=15, help="ops listed")
    args = ap.parse_args(argv)
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    import logging

    from harness.backends.local.trainer import LocalTrainer
    from harness.tracking import StepBuffer, Tracker

    cfg = load(args.overrides)
    trainer = LocalTrainer(cfg, torch.device("cpu"))
    for _ in range(args.warmup):
        trainer.run_step()
    with tempfile.TemporaryDirectory() as tmp:
        per_step = Tracker(f"sqlite:///{tmp}/p.db", "profile")  # one log_batch per step (before StepBuffer)
        batched = Tracker(f"sqlite:///{tmp}/p.db", "profile")  # what harness.run does: StepBuffer
        buffer, every = StepBuffer(batched), trainer.cfg.trainer.checkpoint_every or 10
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        per: dict[str, list[float]] = {k: [] for k in [*PHASES, LOG_BATCHED, LOG_EACH, "step (incl. logging)"]}
        for i in range(args.steps):
            values = trainer.run_step()
            t = time.perf_counter()
            per_step.log_step(i, values)
            t_each = time.perf_counter() - t
            t = time.perf_counter()
            buffer.add(i, values)
            if (i + 1) % every == 0:  # the loops flush before every checkpoint
                buffer.flush()
            t_log = time.perf_counter() - t
            for name, key in PHASES.items():
                per[name].append(values[key])
            per[LOG_BATCHED].append(t_log)
            per[LOG_EACH].append(t_each)
            per["step (incl. logging)"].append(values[M.TIME_STEP] + t_log)
    per[LOG_BATCHED] = [sum(per[LOG_BATCHED]) / len(per[LOG_BATCHED])]  # amortised: the flush is every `every` steps
    total = statistics.median(per["step (incl. logging)"])
    print(f"spec: {' '.join(args.overrides) or 'defaults'}; {args.steps} steps after {args.warmup} warm-up; medians")
    for name, xs in per.items():
        med = statistics.median(xs)
        if name == LOG_EACH:
            print(f"  {name:28s} {med * 1e3:8.1f} ms  (not in the step: before StepBuffer)")
            continue
        print(f"  {name:28s} {med * 1e3:8.1f} ms  {100 * med / total:5.1f}%")
    if args.profile_steps:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                trainer.run_step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
