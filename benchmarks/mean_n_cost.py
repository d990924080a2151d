"""What mean_n's n costs (issue 15 (d)): seconds per training step of ``mean_n`` for each n beside
``recompute``, side by side in one run with interleaved repetitions, and the ratios to recompute.

    python benchmarks/mean_n_cost.py                                      # the calibrated spec (router sigma 0.1)
    python benchmarks/mean_n_cost.py --ns 1,2,4,8,16 --reps 3 inference.router_noise_sigma=1.0

Each arm trains a fresh synchronous trainer of the spec (warm start from the cache) for ``--steps`` steps and
keeps the wall time of each ``run_step`` after the first ``--warmup``, and its ``time/old_logprob_s`` (the n
scoring passes; recompute's one training-engine pass). The repetitions go round the arms in a rotating order, so
drift in the machine's load spreads over all of them. Reported: median (IQR) seconds per step and per pi_old,
their ratios to recompute, and the 1-minute load average before and after. One torch thread.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.overlap import quartiles  # noqa: E402
from harness import metrics as M  # noqa: E402
from harness.backends.local.trainer import LocalTrainer  # noqa: E402
from harness.spec import load  # noqa: E402

CALIBRATED = ["inference.router_noise_sigma=0.1"]


def arms(ns: list[int]) -> dict[str, list[str]]:
    out = {"recompute": ["estimator=recompute"]}
    out.update({f"mean_{n}": ["estimator=mean_n", f"estimator.n={n}"] for n in ns})
    return out


def run_once(overrides: list[str], steps: int, warmup: int) -> tuple[list[float], list[float]]:
    """(wall seconds of each kept step, its pi_old seconds)."""
    trainer = LocalTrainer(load([*overrides, f"trainer.steps={steps}"]), torch.device("cpu"))
    times, old = [], []
    try:
        for _ in range(steps):
            t = time.perf_counter()
            values = trainer.run_step()
            times.append(time.perf_counter() - t)
            old.append(values[M.TIME_OLD_LOGPROB])
    finally:
        trainer.close()
    return times[warmup:], old[warmup:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help=f"spec overrides (default {' '.join(CALIBRATED)})")
    ap.add_argument("--ns", default="1,2,4,8,16", help="comma-separated n of mean_n")
    ap.add_argument("--steps", type=int, default=10, help="trainer.steps of each run")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each run not kept")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of every arm")
    args = ap.parse_args(argv)
    ns = [int(v) for v in args.ns.split(",") if v]
    if not ns or min(ns) < 1:
        ap.error(f"--ns: integers >= 1, got {args.ns!r}")
    overrides = args.overrides or CALIBRATED
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    spec = arms(ns)
    names = list(spec)
    step = {a: [] for a in names}
    old = {a: [] for a in names}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    for rep in range(args.reps):
        for a in names[rep % len(names):] + names[:rep % len(names)]:
            t, o = run_once([*overrides, *spec[a]], args.steps, args.warmup)
            step[a] += t
            old[a] += o
            print(f"rep {rep + 1}/{args.reps} {a:10s} median so far {statistics.median(step[a]):.3f} s/step",
                  file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    s = {a: quartiles(v) for a, v in step.items()}
    o = {a: quartiles(v) for a, v in old.items()}
    print(f"# mean_n cost benchmark: {' '.join(overrides)}; {args.reps} reps x {args.steps} steps (first "
          f"{args.warmup} dropped); {os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; {wall:.0f} s")
    print("| arm | s/step (IQR) | step / recompute | pi_old s (IQR) | pi_old / recompute |")
    print("|---|---|---|---|---|")
    for a in names:
        print(f"| {a} | {s[a][1]:.3f} ({s[a][0]:.3f}-{s[a][2]:.3f}) | {s[a][1] / s['recompute'][1]:.2f}x | "
              f"{o[a][1]:.4f} ({o[a][0]:.4f}-{o[a][2]:.4f}) | {o[a][1] / o['recompute'][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
