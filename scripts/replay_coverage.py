"""Map the prefix cache's capacity to the replay coverage it gives on a multi-turn task (issue 17).

    python scripts/replay_coverage.py [--capacities 1,0.8,0.5,0.2,0] [--seeds 0,1,2] [--steps 5] [override ...]

For each capacity (``inference.prefix_cache_capacity``) and seed, trains ``--steps`` steps of r3 on the
warm-started policy (``task=lookup`` unless overridden) and prints the mean ``moe/replay_coverage`` and
``moe/replay_drift`` over the steps and seeds, and the mean wall seconds per step (``time/step_s``). The
coverage a capacity gives depends on the turn-1 lengths, so measure it on the policy the sweep starts from:
the mapping in ``sweeps/agentic.yaml``'s comment comes from this script.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from harness import metrics as M
from harness.backends.local.trainer import LocalTrainer
from harness.config import load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacities", default="1,0.8,0.5,0.2,0")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. trainer.prompts_per_step=8")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("capacity  coverage  drift   s/step")
    for cap in (float(c) for c in args.capacities.split(",")):
        cov, drift, secs = [], [], []
        for seed in (int(s) for s in args.seeds.split(",")):
            cfg = load(["task=lookup", "estimator=r3", f"inference.prefix_cache_capacity={cap}", f"seed={seed}",
                        *args.overrides])
            tr = LocalTrainer(cfg, torch.device("cpu"))
            for _ in range(args.steps):
                m = tr.run_step()
                cov.append(m[M.MOE_REPLAY_COVERAGE])
                drift.append(m[M.MOE_REPLAY_DRIFT])
                secs.append(m[M.TIME_STEP])
        print(f"{cap:8.2f}  {statistics.mean(cov):8.3f}  {statistics.mean(drift):5.3f}  {statistics.mean(secs):7.2f}"
              f"   (coverage min {min(cov):.3f}, max {max(cov):.3f})", flush=True)


if __name__ == "__main__":
    main()
