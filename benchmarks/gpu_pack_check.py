"""Does a seed train the same alone and in a pack on this device? (issue 29's identity check, for a GPU machine)

    python benchmarks/gpu_pack_check.py [--device cuda] [--pack 8] [--steps 3] [--against again] [OVERRIDES ...]

Trains seed ``k`` of the default spec (``OVERRIDES`` change it) alone, and as member ``k`` of a pack of seeds
0..pack-1, for ``--steps`` steps on one device, and compares every logged value of that seed (the time keys
and throughput excepted) step by step. Prints one line per step: the number of keys compared, how many differ, and the largest
absolute difference. On a CPU the pack tests hold this bitwise (tests/backends/local/); a GPU's kernels may pick
other reductions for other batch shapes, so this is where it is measured rather than assumed. ``--against again``
compares the pack with a second training of the same pack instead (run-to-run: CUDA's atomic adds). Needs no
MLflow.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(ROOT))

from harness import numerics  # noqa: E402
from harness.spec import load  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda if available)")
    ap.add_argument("--pack", type=int, default=8)
    ap.add_argument("--member", type=int, default=3, help="which seed of the pack is compared")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--against", choices=["alone", "again"], default="alone",
                    help="alone: the seed trained alone; again: the same pack trained a second time (run-to-run)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    numerics.pin()
    torch.set_num_threads(1)
    from harness.backends.local.trainer import PackTrainer

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    base = load([*args.overrides, f"trainer.steps={args.steps + 1}"])
    cfgs = [dataclasses.replace(base, seed=s) for s in range(args.pack)]
    pack = PackTrainer(cfgs, device)
    other, j = ((PackTrainer([cfgs[args.member]], device), 0) if args.against == "alone" else
                (PackTrainer(cfgs, device), args.member))
    what = "alone" if args.against == "alone" else "in a second run of the same pack"
    print(f"# device {device}; seed {args.member} {what} vs in a pack of {args.pack}; {' '.join(args.overrides)}")
    worst = 0
    for step in range(args.steps):
        a, b = other.step_seeds()[j], pack.step_seeds()[args.member]
        keys = sorted(k for k in a if not k.startswith(("time/", "tokens/")))  # wall times, throughput
        diff = {k: abs(a[k] - b[k]) for k in keys if not (a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])))}
        worst = max(worst, len(diff))
        print(f"step {step}: {len(keys)} keys, {len(diff)} differ, max |diff| {max(diff.values(), default=0.0):.3g}"
              + (f" ({', '.join(sorted(diff))})" if diff else ""), flush=True)
    print("bitwise the same" if worst == 0 else "NOT bitwise the same")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
