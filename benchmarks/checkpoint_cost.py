"""Cost of checkpointing a local run: one checkpoint write against the training steps it covers.

``python benchmarks/checkpoint_cost.py [--steps 12] [--every 10] [OVERRIDE ...]`` builds the default
run (or the overrides'), warm-started from the cache, trains ``--steps`` steps, and writes the real
checkpoint (``RunRecord.save_checkpoint``: model, optimiser, every RNG state, rewards; tmp + rename)
after each step, timing both in the same process, interleaved. Overhead at cadence k:
``save_s / (k * step_s)``. Prints the medians, the checkpoint size and the overhead for a few cadences.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    steps, every, overrides = 12, 10, []
    it = iter(argv)
    for a in it:
        if a == "--steps":
            steps = int(next(it))
        elif a == "--every":
            every = int(next(it))
        else:
            overrides.append(a)
    import torch

    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import load
    from harness.record import RunRecord

    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load([f"out_dir={tmp}/run", f"tracking.uri=sqlite:///{tmp}/m.db", *overrides])
        trainer = LocalTrainer(cfg, torch.device("cpu"))
        record = RunRecord(cfg)
        record.dir.mkdir(parents=True)
        step_s, save_s, rewards = [], [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            rewards.append(trainer.run_step()["reward/mean"])
            t1 = time.perf_counter()
            record.save_checkpoint(trainer.state_dict(), {"rewards": rewards})
            t2 = time.perf_counter()
            step_s.append(t1 - t0)
            save_s.append(t2 - t1)
        size = record.checkpoint_path.stat().st_size
    st, sv = statistics.median(step_s), statistics.median(save_s)
    print(f"spec sig {cfg.signature}: median step {st * 1000:.1f} ms, median checkpoint write {sv * 1000:.1f} ms "
          f"({size / 1e6:.2f} MB), {steps} of each, interleaved")
    for k in sorted({1, 5, every, 25, 50}):
        print(f"  checkpoint_every={k:3d}: overhead {100 * sv / (k * st):.2f}% of training time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
