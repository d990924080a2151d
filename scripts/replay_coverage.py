"""Map the prefix cache's capacity to the replay coverage it gives on a multi-turn task, and time the steps
(issue 17).

    python scripts/replay_coverage.py [--arms r3@1,r3@0.8,r3@0.5,r3@0.2,r3@0] [--seeds 0,1,2] [--steps 5]
                                      [override ...]

For each seed, builds one trainer per arm ESTIMATOR@CAPACITY (``inference.prefix_cache_capacity``; ``task=lookup``
unless overridden) on the warm-started policy and trains ``--steps`` steps of each, interleaved round-robin (so
machine load hits every arm alike); prints per arm the mean ``moe/replay_coverage`` and ``moe/replay_drift`` over
steps and seeds, and the median wall seconds per step (``time/step_s``, one torch thread). The coverage a capacity
gives depends on the turn-1 lengths, so measure it on the policy the sweep starts from: the mapping in
``sweeps/agentic.yaml``'s comment comes from this script.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from harness import metrics as M
from harness.backends.local.trainer import LocalTrainer
from harness.spec import load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default="r3@1,r3@0.8,r3@0.5,r3@0.2,r3@0", help="ESTIMATOR@CAPACITY, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. trainer.prompts_per_step=8")
    args = ap.parse_args()
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    arms = [(e, float(c)) for e, _, c in (a.partition("@") for a in args.arms.split(","))]
    seen: dict[tuple, list[dict]] = {a: [] for a in arms}
    for seed in (int(s) for s in args.seeds.split(",")):
        trainers = {(e, c): LocalTrainer(load(["task=lookup", f"estimator={e}", f"inference.prefix_cache_capacity={c}",
                                               f"seed={seed}", *args.overrides]), torch.device("cpu"))
                    for e, c in arms}
        for _ in range(args.steps):
            for arm, tr in trainers.items():
                seen[arm].append(tr.run_step())
    print("estimator  capacity  coverage (min-max)      drift   s/step (median)")
    for (e, c), steps in seen.items():
        cov = [m[M.MOE_REPLAY_COVERAGE] for m in steps]
        drift = statistics.mean(m[M.MOE_REPLAY_DRIFT] for m in steps)
        secs = statistics.median(m[M.TIME_STEP] for m in steps)
        print(f"{e:9}  {c:8.2f}  {statistics.mean(cov):.3f} ({min(cov):.3f}-{max(cov):.3f})  {drift:.3f}  {secs:7.2f}")


if __name__ == "__main__":
    main()
