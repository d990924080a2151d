"""What mean_n costs end to end with one-step-off overlap (issue 17, item 3): seconds per training step of
``mean_n`` (n=8) and ``recompute``, each synchronous and with ``trainer.overlap`` (a rollout process), side by
side in one run, with interleaved repetitions; the ratios mean_8 / recompute without and with overlap.

    python benchmarks/overlap.py                              # default spec (experiments/config.yaml)
    python benchmarks/overlap.py task=addition --reps 5       # any spec overrides
    python benchmarks/overlap.py --modes sync,process,thread  # also the in-process thread variant (measured, not shipped)

Each (estimator, mode) trains a fresh trainer of the spec (warm start from the cache) for ``--steps`` steps;
the wall time of each ``run_step`` after the first ``--warmup`` is kept (step 0 can overlap with nothing).
The repetitions go round the (estimator, mode) pairs in a rotating order, so drift in the machine's load
spreads over all of them; reported: the median seconds per step over every kept step of every repetition,
its inter-quartile range, and the machine's 1-minute load average before and after. One torch thread per
process (the trainer, the rollout worker).

Modes: ``sync`` = ``LocalTrainer`` (rollout, then update); ``process`` = ``OverlapTrainer`` (what
``trainer.overlap=true`` runs); ``thread`` = the same schedule with the rollout side in a Python thread of the
trainer's process (the alternative to a process, here only to measure it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.backends.local.model import PolicyPack  # noqa: E402
from harness.backends.local.overlap import OverlapTrainer, RolloutSide, publish  # noqa: E402
from harness.backends.local.trainer import LocalTrainer  # noqa: E402
from harness import metrics as M  # noqa: E402
from harness.spec import load  # noqa: E402

ESTIMATORS = {"recompute": ["estimator=recompute"], "mean_8": ["estimator=mean_n", "estimator.n=8"]}


class ThreadOverlap(LocalTrainer):
    """The overlap schedule of ``OverlapTrainer`` with the rollout side in a thread (GIL shared)."""

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.shared = PolicyPack(cfg.model, self.size, self.policy.vocab_size)
        self.side = RolloutSide(cfg, self.shared, str(device))
        self.thread: threading.Thread | None = None
        self.batch = None

    def _start(self) -> None:
        publish(self.policy, self.shared)
        self.thread = threading.Thread(target=lambda: setattr(self, "batch", self.side.collect()))
        self.thread.start()

    def step_seeds(self):
        t_step = time.perf_counter()
        if self.thread is None:
            self._start()
        self.thread.join()
        batch, self.thread = self.batch, None
        if self.step + 1 < self.cfg.trainer.steps:
            self._start()
        return self.learn(batch, t_step)

    def sync_weights(self) -> None:
        pass


MODES = {"sync": LocalTrainer, "process": OverlapTrainer, "thread": ThreadOverlap}


def run_once(overrides: list[str], estimator: str, mode: str, steps: int, warmup: int) -> tuple[list, list]:
    """(wall seconds of each kept step, the rollout side's share of each: see ``rollout_side``)."""
    over = [*overrides, *ESTIMATORS[estimator], f"trainer.steps={steps}",
            f"trainer.overlap={'true' if mode == 'process' else 'false'}"]
    trainer = MODES[mode](load(over), torch.device("cpu"))
    times, sides = [], []
    try:
        for _ in range(steps):
            t = time.perf_counter()
            values = trainer.run_step()
            times.append(time.perf_counter() - t)
            sides.append(rollout_side(values, trainer.estimator.passes() > 0))
    finally:
        trainer.close()
    return times[warmup:], sides[warmup:]


def rollout_side(values: dict, passes: bool) -> float:
    """Of a synchronous step: the seconds that overlap moves to the rollout process (generation, and the
    estimator's inference passes where it has them); the rest of the step stays with the trainer."""
    return values[M.TIME_ROLLOUT] + (values[M.TIME_OLD_LOGPROB] if passes else 0.0)


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. task=addition")
    ap.add_argument("--steps", type=int, default=12, help="trainer.steps of each run")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each run not kept")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of every (estimator, mode)")
    ap.add_argument("--modes", default="sync,process", help="comma-separated: sync, process, thread")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown or "sync" not in modes:
        ap.error(f"--modes: need sync, and only {', '.join(MODES)}; got {args.modes}")
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)

    pairs = [(e, m) for m in modes for e in ESTIMATORS]
    kept: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    sides: dict[str, list[tuple[float, float]]] = {e: [] for e in ESTIMATORS}  # (rollout, trainer) side, sync steps
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    for rep in range(args.reps):
        order = pairs[rep % len(pairs):] + pairs[:rep % len(pairs)]  # rotate: no pair always runs first
        for est, mode in order:
            times, rolls = run_once(args.overrides, est, mode, args.steps, args.warmup)
            kept[(est, mode)] += times
            if mode == "sync":
                sides[est] += [(r, t - r) for t, r in zip(times, rolls)]
            print(f"rep {rep + 1}/{args.reps} {est:9s} {mode:7s} median so far "
                  f"{statistics.median(kept[(est, mode)]):.3f} s/step", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()

    med = {p: quartiles(v) for p, v in kept.items()}
    spec = " ".join(args.overrides) or "(default spec)"
    print(f"# overlap benchmark: {spec}; {args.reps} reps x {args.steps} steps (first {args.warmup} dropped); "
          f"{os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"{wall:.0f} s")
    print("| estimator | " + " | ".join(f"{m} s/step (IQR)" for m in modes) + " | "
          + " | ".join(f"{m} / sync" for m in modes if m != "sync") + " |")
    print("|---" * (1 + 2 * len(modes) - 1) + "|")
    for est in ESTIMATORS:
        cells = [f"{med[(est, m)][1]:.3f} ({med[(est, m)][0]:.3f}-{med[(est, m)][2]:.3f})" for m in modes]
        speed = [f"{med[(est, m)][1] / med[(est, 'sync')][1]:.2f}x" for m in modes if m != "sync"]
        print(f"| {est} | " + " | ".join(cells) + " | " + " | ".join(speed) + " |")
    ratios = {m: med[("mean_8", m)][1] / med[("recompute", m)][1] for m in modes}
    ideal_med = {e: statistics.median(max(r, t) for r, t in v) for e, v in sides.items()}
    side_med = {e: (statistics.median(r for r, _ in v), statistics.median(t for _, t in v)) for e, v in sides.items()}
    print("| **mean_8 / recompute** | " + " | ".join(f"**{ratios[m]:.2f}x**" for m in modes) + " |"
          + " |" * (len(modes) - 1))
    print("\nIdeal overlap on two free cores (a prediction from the synchronous steps, not a measurement): a step "
          "costs max(rollout side, trainer side); " + "; ".join(
              f"{e}: rollout side {side_med[e][0]:.3f} s, trainer side {side_med[e][1]:.3f} s -> "
              f"{ideal_med[e]:.3f} s/step" for e in ESTIMATORS)
          + f"; mean_8 / recompute {ideal_med['mean_8'] / ideal_med['recompute']:.2f}x.")
    best = "process" if "process" in modes else modes[-1]
    r = ratios[best]
    verdict = "at or below" if r <= 1.0 else "above"
    print(f"\nmean_8 with overlap ({best}) costs {r:.2f}x recompute with overlap "
          f"({ratios['sync']:.2f}x without): {verdict} recompute; KwaiKAT claims 0.8-0.9x end to end. "
          f"mean_8 with overlap vs recompute without: "
          f"{med[('mean_8', best)][1] / med[('recompute', 'sync')][1]:.2f}x.")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "spec": args.overrides, "reps": args.reps, "steps": args.steps, "warmup": args.warmup,
            "load_before": load_before, "load_after": load_after, "wall_s": wall,
            "median_iqr": {f"{e}|{m}": med[(e, m)] for e, m in pairs}, "ratio_mean8_recompute": ratios,
            "ideal_overlap_median": ideal_med, "sides_median": side_med,
            "step_times": {f"{e}|{m}": kept[(e, m)] for e, m in pairs}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
