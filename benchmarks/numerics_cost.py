"""What the pinned CPU numerics cost (harness/numerics.py): seconds per training step with the pins (MKL's
COMPATIBLE branch, ATen's AVX2 kernels) beside the same step with whatever MKL and ATen pick on this CPU.

    python benchmarks/numerics_cost.py                       # default spec, 3 rounds x 10 timed steps per side
    python benchmarks/numerics_cost.py estimator=mean_n estimator.n=8 --rounds 5

Each side runs in its own process (the pins are fixed at torch's first operator), the two sides interleaved round
by round so that drift of the machine hits both; one torch thread, warm start from the cache, 2 warm-up steps.
The unpinned side runs an operator before importing the harness and skips ``numerics.check`` (its curve is not a
run's curve: this is a timing only). Prints the median s/step of each side and their ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
pinned = sys.argv[1] == "pinned"
if not pinned:
    os.environ.pop("ATEN_CPU_CAPABILITY", None); os.environ.pop("MKL_CBWR", None)
    import torch; (torch.randn(64, 64) @ torch.randn(64, 64)).sum()  # MKL and ATen pick for this CPU
sys.path.insert(0, sys.argv[2])
from harness import numerics
if pinned:
    numerics.pin()
else:
    numerics.check = lambda: None  # timing only: this process computes unpinned
import torch
torch.set_num_threads(1)
from harness.backends.local.trainer import LocalTrainer
from harness.spec import load
cfg = load(json.loads(sys.argv[3]))
torch.manual_seed(cfg.seed)
tr = LocalTrainer(cfg, torch.device("cpu"))
for _ in range(2):
    tr.run_step()
t = time.perf_counter()
for _ in range(int(sys.argv[4])):
    tr.run_step()
print(json.dumps({"s_per_step": (time.perf_counter() - t) / int(sys.argv[4]), "fingerprint": numerics.fingerprint()}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    times: dict[str, list[float]] = {"pinned": [], "native": []}
    prints: dict[str, dict] = {}
    for r in range(args.rounds):
        for side in ("native", "pinned") if r % 2 else ("pinned", "native"):
            out = subprocess.run([sys.executable, "-c", CHILD, side, str(ROOT), json.dumps(args.overrides),
                                  str(args.steps)], capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            times[side].append(res["s_per_step"])
            prints[side] = res["fingerprint"]
            print(f"round {r + 1} {side:7s} {res['s_per_step']:.3f} s/step", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nspec: {' '.join(args.overrides) or '(default)'}; {args.steps} timed steps x {args.rounds} rounds; "
          f"CPU {prints['pinned']['cpu']}")
    for side in ("native", "pinned"):
        print(f"{side:7s} {med[side]:.3f} s/step   ({prints[side]['key']})")
    print(f"pinned / native: {med['pinned'] / med['native']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
