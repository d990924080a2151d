"""How a seed pack scales: s/step, seed-steps/s and operator calls per step for packs of 1, 8, 32, 128, 256 seeds
(issue 29), on the device it finds, all measured in one process.

    python benchmarks/pack_scaling.py                          # cuda if available, else cpu; packs 1 8 32 128 256
    python benchmarks/pack_scaling.py --device cpu --packs 1 8 --steps 3 --quick

For each estimator (``--estimators``, default recompute and mean_n with n = 8) and pack size S: a ``PackTrainer``
of seeds 0..S-1 of the default spec (``--overrides`` change it) takes ``--warmup`` steps, then ``--steps`` timed steps
(``torch.cuda.synchronize`` around each on CUDA); its seed-steps/s is S / (s/step) and its ratio is that over the
pack of one's. ``set-up s``: the pack's construction (its seeds built and warm-started together, or read from the
warm-start cache, and moved to the device; ``--cold``: from an empty cache, so every warm start is computed). Then one more step runs under a ``TorchDispatchMode`` that counts every ATen operator call and the
host synchronisations among them (``.item()``/``.tolist()`` read-backs, ``nonzero``, copies to the host):
**the operator count per step must not grow with the pack size** (issue 29's device-independent check, target:
a pack of 64 within 1.1x of a pack of 1). A pack that runs out of memory is reported and the larger ones skipped.
On CUDA, ``--kernels`` also counts one step's GPU kernels (``torch.profiler``: a C++ loop inside one operator, such as
float32 ``grouped_mm``'s per-group GEMMs, shows there and not in the operator count); ``--dense on|off`` picks the
experts' GEMM path (``harness/backends/local/grouped.py``; default: dense on any device but the CPU).

One torch thread (``--threads``) unless told otherwise: on a 2-core machine timings swing with two. Beside the wall
time, the process's CPU time per step (``time.process_time``): on a shared CPU (a study running beside) it is the
fairer measure of what the step costs; on CUDA it is the host's share only.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(ROOT))

from harness import numerics  # noqa: E402
from harness.backends.local.opcount import OpCount  # noqa: E402
from harness.spec import load  # noqa: E402

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(estimator: list[str], size: int, device: torch.device, args) -> dict:
    """One pack of ``size`` seeds: its s/step (median of the timed steps), operator calls and syncs per step."""
    from harness.backends.local.trainer import PackTrainer

    base = load([*estimator, *args.overrides, f"trainer.steps={args.warmup + args.steps + 2}"])
    cfgs = [dataclasses.replace(base, seed=s) for s in range(size)]  # composed once: 256 composes take a minute
    if args.cold:  # set-up from scratch: an empty warm-start cache for this pack
        from harness.backends.local import warmstart
        warmstart.CACHE = Path(tempfile.mkdtemp(prefix="pack-scaling-cache-"))
    _sync(device)
    t0 = time.perf_counter()
    trainer = PackTrainer(cfgs, device)  # set-up: the seeds built, warm-started (or read from the cache), on device
    _sync(device)
    setup = time.perf_counter() - t0
    for _ in range(args.warmup):
        trainer.step_seeds()
    times, cpu = [], []
    for _ in range(args.steps):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.step_seeds()
        _sync(device)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    with OpCount() as count:
        trainer.step_seeds()
    kernels = None
    if device.type == "cuda" and args.kernels:  # the GPU kernels one step launches (profiler)
        from torch.profiler import DeviceType, ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            trainer.step_seeds()
            _sync(device)
        kernels = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    s_step = statistics.median(times)
    c_step = statistics.median(cpu)
    return {"setup": setup, "s_step": s_step, "seed_steps_s": size / s_step, "cpu_step": c_step, "cpu_seed_steps_s": size / c_step,
            "ops": count.ops, "syncs": count.syncs, "kernels": kernels}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda if available)")
    ap.add_argument("--packs", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    ap.add_argument("--estimators", nargs="+", default=["estimator=recompute", "estimator=mean_n,estimator.n=8"],
                    help="one spec per item, its overrides joined by commas")
    ap.add_argument("--overrides", nargs="*", default=[], help="overrides of every spec, e.g. model=dense_tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dense", choices=["auto", "on", "off"], default="auto",
                    help="the experts' GEMMs as one bmm over a common capacity (auto: on any device but the CPU; "
                         "harness/backends/local/grouped.py)")
    ap.add_argument("--kernels", action="store_true", help="on CUDA, also count one step's GPU kernels (profiler)")
    ap.add_argument("--quick", action="store_true", help="2 timed steps after 1 warm-up (a smoke test)")
    ap.add_argument("--cold", action="store_true",
                    help="set up every pack from an empty warm-start cache (its warm starts computed, together)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 2, 1
    numerics.pin()
    torch.set_num_threads(args.threads)
    from harness.backends.local import grouped
    grouped.DENSE = {"auto": None, "on": True, "off": False}[args.dense]
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({args.threads} thread(s))"
    print(f"# device: {name}; torch {torch.__version__}; {args.steps} timed steps after {args.warmup} warm-up; "
          f"dense expert GEMMs: {args.dense}")
    print("| estimator | pack | set-up s | s/step | seed-steps/s | x one seed | CPU s/step | x one seed (CPU) | ops/step | "
          "ops/step / pack of 1 | host syncs/step | GPU kernels/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.estimators:
        overrides = spec.split(",")
        base = None
        for size in args.packs:
            try:
                r = measure(overrides, size, device, args)
            except torch.OutOfMemoryError:
                print(f"| {spec} | {size} | out of memory | | | | | | | | | |")
                break
            base = base or r
            print(f"| {spec} | {size} | {r['setup']:.2f} | {r['s_step']:.3f} | {r['seed_steps_s']:.1f} | "
                  f"{r['seed_steps_s'] / base['seed_steps_s']:.2f} | {r['cpu_step']:.3f} | "
                  f"{r['cpu_seed_steps_s'] / base['cpu_seed_steps_s']:.2f} | {r['ops']} | {r['ops'] / base['ops']:.2f} | "
                  f"{r['syncs']} | {'' if r['kernels'] is None else r['kernels']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
