"""Two (or more) versions of the code side by side: s/step of the same pack, interleaved, and whether every logged
value is bitwise the same (a speed change must move none).

    python benchmarks/ab_trees.py 73df5e4 HEAD                                  # default spec (recompute), 1 seed
    python benchmarks/ab_trees.py 73df5e4 HEAD --size 8 --rounds 6 --k 1 --overrides estimator=mean_n estimator.n=8

Each version (a commit, exported with ``git archive`` into a temporary folder, or the path of a checkout) runs in a
worker process of its own that builds a ``PackTrainer`` of seeds 0..size-1 and takes one warm-up step; then the
workers take ``--k`` steps in turn, ``--rounds`` times, the order reversed every round, so that drift of a shared
machine hits every version alike. Per version: the median wall and CPU (``time.process_time``: the process's own
time, less sensitive to other load) seconds per step, the median over rounds of its CPU time / the first version's,
and whether every metric of every step and seed (wall times excepted) equals the first version's bitwise.
One torch thread, the CPU numerics pinned (``harness.numerics.pin``), as a run.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from harness import numerics
numerics.pin()
import torch
torch.set_num_threads(1)
from harness.backends.local.trainer import PackTrainer
from harness.spec import load
overrides, size = json.loads(sys.argv[2]), int(sys.argv[3])
trainer = PackTrainer([load([*overrides, f"seed={s}", "trainer.steps=100000"]) for s in range(size)],
                      torch.device("cpu"))
step = getattr(trainer, "step_seeds", None) or trainer.run_step  # older versions: run_step
step()
print("ready", flush=True)
for line in sys.stdin:
    times, values = [], []
    for _ in range(int(line)):
        t, c = time.perf_counter(), time.process_time()
        per_seed = step()
        times.append((time.perf_counter() - t, time.process_time() - c))
        values.append([{k: v for k, v in d.items() if not k.startswith("time/") and k != "tokens/per_s"}
                       for d in per_seed])
    print(json.dumps({"times": times, "values": values}), flush=True)
"""


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (json floats)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _tree(version: str, tmp: Path) -> Path:
    """A checkout's path, or a commit exported into ``tmp`` (with a copy of this checkout's warm-start cache)."""
    if Path(version).is_dir():
        return Path(version).resolve()
    out = tmp / version.replace("/", "_")
    out.mkdir()
    archive = subprocess.run(["git", "archive", version], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    if (ROOT / ".cache").is_dir():
        shutil.copytree(ROOT / ".cache", out / ".cache")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="+", help="commits or checkout paths; the first is the reference")
    ap.add_argument("--overrides", nargs="*", default=[], help="spec overrides, e.g. estimator=mean_n estimator.n=8")
    ap.add_argument("--size", type=int, default=1, help="seeds in the pack")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--k", type=int, default=3, help="steps per version and round")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = [_tree(v, Path(tmp)) for v in args.versions]
        workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(t), json.dumps(args.overrides), str(args.size)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=t) for t in trees]
        for w in workers:
            while w.stdout.readline().strip() != "ready":
                pass
        times: list[list] = [[] for _ in workers]
        values: list[list] = [[] for _ in workers]
        ratios: list[list[float]] = [[] for _ in workers]
        for r in range(args.rounds):
            cpu = {}
            for i in (range(len(workers)) if r % 2 == 0 else reversed(range(len(workers)))):
                workers[i].stdin.write(f"{args.k}\n")
                workers[i].stdin.flush()
                out = json.loads(workers[i].stdout.readline())
                times[i] += out["times"]
                values[i] += out["values"]
                cpu[i] = statistics.median(c for _, c in out["times"])
            for i in cpu:
                ratios[i].append(cpu[i] / cpu[0])
        for w in workers:
            w.stdin.close()
            w.wait()
    print(f"# {' '.join(args.overrides) or 'default spec'}, pack of {args.size}: {args.rounds} rounds x {args.k} steps")
    print("| version | wall s/step | CPU s/step | CPU / first | every logged value bitwise the first's |")
    print("|---|---|---|---|---|")
    for i, v in enumerate(args.versions):
        print(f"| {v} | {statistics.median(w for w, _ in times[i]):.3f} | {statistics.median(c for _, c in times[i]):.3f}"
              f" | {statistics.median(ratios[i]):.3f} | {_same(values[i], values[0])} ({len(values[i])} steps) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
