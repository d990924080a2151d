"""The local backend on CUDA, without MLflow or Hydra (for a bare GPU machine).

    python benchmarks/cuda_check.py [--steps 20]

For each device available (cpu, cuda): train a few steps of several estimators with the local
trainer and run the noise probe for moe_tiny, dense_tiny and a bigger MoE, printing step times and
the probe table side by side. Checks that nothing in the local backend is tied to the CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from harness.spec import RunConfig, validate


def make(device: str, estimator: dict, model: dict | None = None) -> RunConfig:
    cfg = RunConfig()
    cfg.backend.device = device
    cfg.estimator = dataclasses.replace(cfg.estimator, **estimator)
    if model:
        cfg.model = dataclasses.replace(cfg.model, **model)
    return validate(cfg)


ESTIMATORS = [{"name": "recompute"}, {"name": "mean_n", "n": 8}, {"name": "r3"},
              {"name": "tis", "clip_c": 2.0, "level": "token"}, {"name": "deterministic", "noise": "removed"}]
BIG = {"name": "moe_big", "d_model": 256, "n_layers": 4, "n_heads": 8, "n_experts": 16, "top_k": 4, "d_expert": 256}
DENSE = {"name": "dense_tiny", "kind": "dense"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    from harness.backends.local.probe import probe
    from harness.backends.local.trainer import LocalTrainer

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices:
        print("cuda device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    print("| device | estimator | model | s/step | reward first -> last | k3 last | routing flips |")
    print("|---|---|---|---|---|---|---|")
    for dev in devices:
        for est in ESTIMATORS:
            for model in (None, BIG):
                cfg = make(dev, est, model)
                tr = LocalTrainer(cfg, torch.device(dev))
                rewards, times, out = [], [], {}
                for _ in range(args.steps):
                    t = time.perf_counter()
                    out = tr.run_step()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - t)
                    rewards.append(out["reward/mean"])
                med = sorted(times[2:])[len(times[2:]) // 2]
                print(f"| {dev} | {est['name']} | {cfg.model.name} | {med:.3f} | {rewards[0]:.3f} -> {rewards[-1]:.3f} | "
                      f"{out['mismatch/k3']:.1e} | {out.get('moe/routing_flip_rate', float('nan')):.3f} |", flush=True)
    print()
    print("| device | model | diff | var_rollout | var_train | var_rollout deterministic |")
    print("|---|---|---|---|---|---|")
    for dev in devices:
        for model in (None, DENSE, BIG):
            cfg = make(dev, {"name": "recompute"}, model)
            r = probe(cfg, n=8, sequences=256)
            cfg_det = dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, deterministic=True))
            d = probe(cfg_det, n=8, sequences=256)
            print(f"| {dev} | {r.model} | {r.diff:.2e} | {r.var_rollout:.2e} | {r.var_train:.2e} | {d.var_rollout:.2e} |", flush=True)


if __name__ == "__main__":
    main()
