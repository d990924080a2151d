"""How far a training step is from what this CPU's matrix units allow: the GEMM floor of a step.

    python benchmarks/roofline.py                              # default spec (experiments/config.yaml)
    python benchmarks/roofline.py estimator=mean_n estimator.n=8

One torch thread, as a run. It records every matrix product of ``--steps`` training steps of the spec
(``torch.utils.flop_counter``, with a formula for the experts' grouped GEMMs: the floating-point operations; a
dispatch mode: the operand shapes and group offsets), then
times, side by side in this process:

- the step itself (median of ``--reps`` steps);
- every recorded product replayed alone on random operands of its shape (same op, same shapes, in
  order): the step's *GEMM time*, what the products cost with nothing else around them;
- one large float32 GEMM (2048^3): this core's *peak* rate; FLOPs / peak is the step's *GEMM floor*.

It prints the shares and the ablation target of issue 13 against the floor: 9 estimators x 20 seeds x
300 steps on 2 cores in 30 minutes needs a step of at most 1800 s x 2 / (20 x 300 x (8 + r)) with r the
mean_n(8) / recompute step ratio, measured here too: a mean_n (n=8) trainer of the same spec steps in the
same interleaved repetitions (``--mean-n-ratio R`` gives it instead).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.spec import load  # noqa: E402

GEMMS = {"aten.bmm.default", "aten.mm.default", "aten.addmm.default", "aten.baddbmm.default"}
GROUPED = "aten._grouped_mm.default"  # the experts (no padding): x [M, K] @ w[group] [G, K, N], rows by group


def _grouped_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of a grouped GEMM: every row of x meets one [K, N] matrix (flop_counter has no formula for it)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[-1]


class _Shapes(TorchDispatchMode):
    """Records (op, operand shapes, dtype) of every matrix product dispatched."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, kwargs = str(func), kwargs or {}
        if name in GEMMS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.calls.append((func, tuple(tuple(t.shape) for t in tensors), tensors[0].dtype, {}))
        elif name == GROUPED:  # the group offsets are data: kept, so the replay has the same groups
            a, b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            self.calls.append((func, (tuple(a.shape), tuple(b.shape)), a.dtype, {"offs": offs.clone()}))
        return func(*args, **kwargs)


def _replay(calls: list[tuple]) -> float:
    """Seconds to run the recorded products alone, in order, on fresh operands of their shapes."""
    ops = [(func, [torch.randn(s, dtype=dt) for s in shapes], kw) for func, shapes, dt, kw in calls]
    t = time.perf_counter()
    for func, operands, kw in ops:
        func(*operands, **kw)
    return time.perf_counter() - t


def _peak(size: int = 2048, seconds: float = 1.0) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        a @ b
        n += 1
    return 2 * size ** 3 * n / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. estimator=mean_n estimator.n=8")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="steps recorded (FLOPs and shapes)")
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions of step / replay / peak")
    ap.add_argument("--mean-n-ratio", type=float, default=None,
                    help="mean_n(8) / recompute step for the ablation bound (default: measured in this run)")
    args = ap.parse_args(argv)
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    from torch.utils.flop_counter import FlopCounterMode

    from harness.backends.local.trainer import LocalTrainer

    trainer = LocalTrainer(load(args.overrides), torch.device("cpu"))
    mean_n = None
    if args.mean_n_ratio is None:  # the spec's estimator replaced by mean_n (n=8): the ratio's numerator
        mean_n = LocalTrainer(load([*args.overrides, "estimator=mean_n", "estimator.n=8"]), torch.device("cpu"))
    for _ in range(args.warmup):
        trainer.run_step()
        if mean_n is not None:
            mean_n.run_step()
    shapes = _Shapes()
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_flops}) as counter, shapes:
        for _ in range(args.steps):
            trainer.run_step()
    flops = counter.get_total_flops() / args.steps
    by_op = {str(k): v / args.steps for k, v in counter.get_flop_counts().get("Global", {}).items()}
    calls = shapes.calls
    per_step = len(calls) / args.steps
    step_t, mean_n_t, gemm_t, peak = [], [], [], []
    for _ in range(args.reps):  # interleaved: the ratios survive a drifting machine
        t = time.perf_counter()
        trainer.run_step()
        step_t.append(time.perf_counter() - t)
        if mean_n is not None:
            t = time.perf_counter()
            mean_n.run_step()
            mean_n_t.append(time.perf_counter() - t)
        gemm_t.append(_replay(calls) / args.steps)
        peak.append(_peak())
    step, gemm, rate = statistics.median(step_t), statistics.median(gemm_t), statistics.median(peak)
    floor = flops / rate
    ratio = args.mean_n_ratio if mean_n is None else statistics.median(mean_n_t) / step
    source = "given" if mean_n is None else "measured in this run"
    print(f"spec: {' '.join(args.overrides) or 'defaults'}; {args.steps} steps recorded, {args.reps} interleaved reps")
    print(f"  FLOPs per step (matrix products)  {flops / 1e9:8.3f} GFLOP  "
          + ", ".join(f"{k} {v / 1e9:.3f}" for k, v in by_op.items()))
    print(f"  matrix products per step          {per_step:8.0f}")
    print(f"  peak float32 GEMM (2048^3, 1 thread) {rate / 1e9:6.1f} GFLOP/s")
    print(f"  step (median)                     {step * 1e3:8.1f} ms")
    print(f"  its products replayed alone       {gemm * 1e3:8.1f} ms  ({100 * gemm / step:.0f}% of the step; "
          f"{flops / gemm / 1e9:.1f} GFLOP/s)")
    print(f"  GEMM floor (FLOPs / peak)         {floor * 1e3:8.1f} ms  ({100 * floor / step:.0f}% of the step)")
    print(f"  ratio step / GEMM floor           {step / floor:8.2f}x")
    print(f"  ratio step / products alone       {step / gemm:8.2f}x")
    print(f"  mean_n(8) / this step             {ratio:8.2f}x ({source})")
    need = 1800 * 2 / (20 * 300 * (8 + ratio))
    print(f"  issue 13's ablation (180 runs x 300 steps, 2 cores, 30 min) needs a step <= {need * 1e3:.1f} ms: "
          f"{step / need:.2f}x faster than now; at the GEMM floor it would take "
          f"{20 * 300 * (8 + ratio) * floor / 2 / 60:.0f} min, with the products as they run alone "
          f"{20 * 300 * (8 + ratio) * gemm / 2 / 60:.0f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
