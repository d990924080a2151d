"""Is a resumed run the uninterrupted run, value for value, on this device? (issue 41, item 4)

    python benchmarks/resume_check.py [--device cuda] [--steps 8] [--stop 5] [--every 3] [OVERRIDES ...]

Trains the spec (``OVERRIDES``, e.g. ``backend.deterministic=true``) straight for ``--steps`` steps, and again
interrupted after step ``--stop`` and resumed from its last checkpoint (written every ``--every`` steps), each in its
own experiment of a throw-away sqlite store, and compares every logged metric's history step by step (wall times and
throughput excepted). Prints the keys and values compared, how many differ, the largest absolute difference and
``bitwise: yes|no``. On a CPU a resume is bitwise (``tests/backends/local/test_deterministic.py``); on a GPU it is
measured here (``benchmarks/gpu_session.sh``). Needs MLflow (a run logs to a store).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(ROOT))

from harness.run import execute  # noqa: E402
from harness.spec import load  # noqa: E402

SKIP = ("time/", "tokens/", "summary/time")  # wall times and throughput differ between any two runs


def train(overrides: list[str], stop: int | None):
    """The run's summary; with ``stop``: interrupted once after that step, then resumed."""
    cfg = load(overrides)
    if stop is None:
        return cfg, execute(cfg, progress=False)
    seen: list[int] = []

    def interrupt(step, values) -> bool:
        seen.append(step)
        if step == stop and len(seen) == stop + 1:
            raise KeyboardInterrupt  # the first pass only; the resumed one runs to the end
        return False

    try:
        execute(cfg, on_step=interrupt, progress=False)
    except KeyboardInterrupt:
        pass
    return cfg, execute(cfg, on_step=interrupt, progress=False)


def histories(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith(SKIP)]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--stop", type=int, default=5, help="the step after which the first pass is interrupted")
    ap.add_argument("--every", type=int, default=3, help="checkpoint cadence (the resume starts from the last one)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if not 0 < args.every <= args.stop < args.steps - 1:
        ap.error("need 0 < --every <= --stop < --steps - 1 (a checkpoint before the stop, steps after it)")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/m.db"

        def spec(name: str) -> list[str]:
            return [*args.overrides, f"backend.device={args.device}", f"trainer.steps={args.steps}",
                    f"trainer.checkpoint_every={args.every}", f"tracking.uri={uri}", f"tracking.experiment={name}",
                    f"out_dir={tmp}/{name}"]

        _, straight = train(spec("straight"), None)
        _, resumed = train(spec("resumed"), args.stop)
        a, b = histories(uri, straight.run_id), histories(uri, resumed.run_id)
    keys = sorted(set(a) | set(b))
    values = differ = 0
    worst = 0.0
    for k in keys:
        if [s for s, _ in a.get(k, [])] != [s for s, _ in b.get(k, [])]:
            print(f"{k}: logged at other steps ({len(a.get(k, []))} vs {len(b.get(k, []))} values)")
            differ += 1
            continue
        for (s, x), (_, y) in zip(a[k], b[k]):
            values += 1
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                differ += 1
                worst = max(worst, abs(x - y))
                if differ <= 10:
                    print(f"{k} at step {s}: {x!r} vs {y!r}")
    print(f"# device {args.device}; {args.steps} steps straight vs interrupted after step {args.stop} and resumed "
          f"(checkpoint every {args.every}); {' '.join(args.overrides)}")
    print(f"{len(keys)} keys, {values} values compared, {differ} differ, max |diff| {worst:.3g}; "
          f"bitwise: {'yes' if differ == 0 else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
