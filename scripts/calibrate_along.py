"""Issue 42, item 4: the noise calibration held on the distribution, not only the mean, along training.

Trains one run of a spec (default: science v4's stage-A cell at dose 1e-3 and lr 3e-4, i.e. v3's sparse condition:
KwaiKAT-shaped sparse router noise held at k3 1e-3, clipping 1.0; seed 950, no study's seed) and every ``--every``
steps probes the policy of that step with the noise scale that step ran at (the KL controller's c_t):
``harness.backends.local.probe.probe_policy``, ``--passes`` fresh inference scorings of ``--sequences`` sampled
sequences: diff (mean |logp_train - logp_inf|), var_rollout, var/diff^2, the tail of |logp_train - logp_inf| (p99,
p99.9) and the routing flip rate. Prints one row per probe and a table per phase (the medians over the phase's probes)
beside KwaiKAT's MoE row (diff 0.008, var_rollout 1e-3, var/diff^2 15.6), and says which moments are held.

    python scripts/calibrate_along.py --out docs/results/v4_calibration       # ~15 min on 2 cores
    python scripts/calibrate_along.py --steps 6 --every 3 --passes 2 --sequences 8 trainer.prompts_per_step=4  # smoke
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KWAIKAT = {"diff": 0.008, "var_rollout": 1e-3, "ratio": 15.6}
CELL = ["estimator=recompute", "trainer.max_grad_norm=1.0", "inference.router_noise_sigma=4.0",
        "inference.router_noise_rate=0.02", "inference.kl_target=0.001", "seed=950"]
FIELDS = ("step", "scale", "diff", "var_rollout", "ratio", "p99", "p999", "flip_rate", "rec_k3")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="spec overrides after the default cell's (e.g. trainer.lr=1.2e-3)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--phases", type=int, default=3, help="phases the run is cut into for the summary table")
    ap.add_argument("--out", default=None, help="folder for along.csv and along.md")
    args = ap.parse_args(argv)
    from harness import numerics
    numerics.pin()
    import torch
    torch.set_num_threads(1)
    from harness.backends.local.model import Policy
    from harness.backends.local.probe import probe_policy
    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import load

    cfg = load([*CELL, *args.overrides, f"trainer.steps={args.steps}"])
    trainer = LocalTrainer(cfg, torch.device("cpu"))
    rows, k3s = [], []

    def measure(step: int) -> None:
        policy = Policy(cfg.model)
        policy.load_state_dict(trainer.policy.policy_state(0))
        scale = None if trainer.kl is None else float(trainer.kl.scale[0])
        r = probe_policy(policy, cfg, args.passes, args.sequences, scale=scale, prompt_seed=10_000 + step,
                         draws=10**6 + step)
        k3 = statistics.mean(k3s[-args.every:]) if k3s else float("nan")
        rows.append({"step": step, "scale": scale if scale is not None else 1.0, "diff": r.diff,
                     "var_rollout": r.var_rollout, "ratio": r.var_rollout / r.diff ** 2, "p99": r.diff_p99,
                     "p999": r.diff_p999, "flip_rate": r.flip_rate, "rec_k3": k3})
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
              flush=True)

    measure(0)
    for step in range(1, args.steps + 1):
        k3s.append(float(trainer.run_step()["mismatch/rec_k3"]))
        if step % args.every == 0:
            measure(step)
    table = phase_table(rows, args.steps, args.phases)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "along.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
        (out / "along.md").write_text(table + "\n")
    return 0


def phase_table(rows: list[dict], steps: int, phases: int) -> str:
    """Medians of each phase's probes beside KwaiKAT's MoE row, and which moments stay within 2x of KwaiKAT's."""
    lines = ["| phase (steps) | probes | noise scale c_t | diff | var_rollout | var/diff^2 | p99 | p99.9 | flip rate | "
             "rec k3 (step mean) |", "|---|---|---|---|---|---|---|---|---|---|",
             f"| KwaiKAT MoE (vLLM vs Megatron) | | | {KWAIKAT['diff']:g} | {KWAIKAT['var_rollout']:g} | "
             f"{KWAIKAT['ratio']:g} | | | | |"]
    width = steps / phases
    held = {}
    for p in range(phases):
        lo, hi = round(p * width), round((p + 1) * width)
        part = [r for r in rows if lo <= r["step"] < hi or (p == phases - 1 and r["step"] == hi)]
        if not part:
            continue
        med = {k: statistics.median(r[k] for r in part) for k in FIELDS[1:]}
        lines.append(f"| {p + 1} ({lo}-{hi}) | {len(part)} | " + " | ".join(f"{med[k]:.3g}" for k in FIELDS[1:]) + " |")
        for k in ("diff", "var_rollout", "ratio"):
            held.setdefault(k, []).append(0.5 <= med[k] / KWAIKAT[k] <= 2.0)
    words = {True: "within 2x of KwaiKAT's in every phase", False: "leaves 2x of KwaiKAT's in some phase"}
    lines.append("")
    lines += [f"- {k}: {words[all(v)]} ({', '.join('yes' if x else 'no' for x in v)})" for k, v in held.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
