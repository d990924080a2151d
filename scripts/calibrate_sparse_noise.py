"""Issue 31, item 4: calibrate the sparse router-noise model to KwaiKAT's two moments at once.

KwaiKAT's MoE row (vLLM vs Megatron, Qwen3): diff = mean |logp_train - logp_inf| ~ 0.008 and var_rollout ~ 1e-3,
so var / diff^2 ~ 15.6: sparse, heavy-tailed deviations. Dense router noise cannot match both: at sigma 0.1 it
gives diff 0.0205 and var_rollout 1.7e-3 here, var / diff^2 = 4.0 (local numerics 4,
docs/results/noise_v3/calibration.txt; the earlier probe in docs/results.md, before numerics 4: 0.018, 9.3e-4, 2.9).
Here the noise hits a share ``rate`` of the
(token, layer) router rows (``inference.router_noise_rate``) with N(0, sigma^2); this script probes a grid of
(sigma, rate) on the warm-started moe_tiny (the noise probe, ``harness.backends.local.probe``, 8 passes x 256
sequences, seed 0: not a confirmatory seed) and prints diff, var_rollout, var / diff^2 the deviation's tail and the routing flip rate,
with the bias-only engine (deterministic: no scoring noise) and dense sigma 0.1 beside.

    python scripts/calibrate_sparse_noise.py [--out docs/results/noise_v3/calibration.csv]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

KWAIKAT = {"diff": 0.008, "var_rollout": 1e-3}
GRID_SIGMA = (1.0, 2.0, 4.0, 8.0)
GRID_RATE = (0.01, 0.02, 0.05, 0.1)


def conditions() -> list[tuple[str, list[str]]]:
    rows = [("natural engine", ["inference.router_noise_sigma=0"]),
            ("bias-only (deterministic bf16)", ["inference.router_noise_sigma=0", "inference.deterministic=true"]),
            ("dense sigma 0.1", ["inference.router_noise_sigma=0.1"])]
    for s in GRID_SIGMA:
        for r in GRID_RATE:
            rows.append((f"sparse sigma {s:g} rate {r:g}",
                         [f"inference.router_noise_sigma={s}", f"inference.router_noise_rate={r}"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the table as CSV here too")
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--only", default=None, help="only conditions whose name contains this")
    args = ap.parse_args(argv)
    from harness import numerics
    from harness.spec import load
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    import torch
    torch.set_num_threads(1)
    from harness.backends.local.probe import probe
    out = []
    print(f"{'condition':36s} {'diff':>9s} {'var_roll':>9s} {'var/d^2':>8s} {'p99':>8s} {'p99.9':>8s} {'flips':>7s}")
    print(f"{'KwaiKAT MoE':36s} {KWAIKAT['diff']:9.2e} {KWAIKAT['var_rollout']:9.2e} "
          f"{KWAIKAT['var_rollout'] / KWAIKAT['diff'] ** 2:8.1f}")
    for name, overrides in conditions():
        if args.only and args.only not in name:
            continue
        r = probe(load(overrides), n=args.passes, sequences=args.sequences)
        ratio = r.var_rollout / r.diff ** 2
        print(f"{name:36s} {r.diff:9.2e} {r.var_rollout:9.2e} {ratio:8.2f} {r.diff_p99:8.3f} {r.diff_p999:8.3f} {r.flip_rate:7.4f}",
              flush=True)
        out.append({"condition": name, "overrides": " ".join(overrides), "diff": r.diff,
                    "var_rollout": r.var_rollout, "var_over_diff2": ratio, "diff_p99": r.diff_p99,
                    "diff_p999": r.diff_p999, "flip_rate": r.flip_rate,
                    "tokens": r.tokens})
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
