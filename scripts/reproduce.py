"""Does this code still reproduce stored runs? Retrain them and compare every logged value with the store.

    python scripts/reproduce.py RUN_DIR [RUN_DIR ...] [--steps N]

For each local run folder (``runs/<experiment>/<signature>``): the spec is rebuilt from its ``spec.yaml`` and must
have the folder's signature (else the folder is another code's run: reported, not retrained); the run's MLflow run
is the one its ``run.json`` names, in the store it names. The run is trained again from its warm start for its
first N steps (default 30; 0 = all it logged) and every metric it logged at those steps, wall times excepted, is
compared with the store **exactly** (float equality; NaN equals NaN). One line per run; exit status 0 when every
value is equal, 1 when any differs or a run cannot be checked. A speed change that claims "numerics unchanged"
(issue 13) is checked against the results' own runs this way, beyond ``tests/test_golden.py``'s tiny budgets.

Bitwise equality is promised between machines of the same numerics fingerprint key (``harness/numerics.py``: the
torch version and the pinned MKL branch and ATen kernels; any x86-64 CPU model or vendor). A run stored under
another key (tag ``numerics.key``) is still retrained and compared, and its line says that the keys differ, so a
difference there is not evidence that the code changed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.record import IDENTITY_FILE, active_run, read_json  # noqa: E402

SKIP = ("time/", "tokens/")  # wall times and throughput: not numerics


def check(run_dir: Path, steps: int) -> tuple[bool, str]:
    """(all equal, one line) for one run folder."""
    import torch
    import yaml
    from mlflow.tracking import MlflowClient

    from harness import metrics as M
    from harness import numerics
    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import ConfigError, build

    ident = read_json(run_dir / IDENTITY_FILE)
    if ident is None or not (run_dir / "spec.yaml").exists():
        return False, f"{run_dir}: no {IDENTITY_FILE} / spec.yaml: not a run folder"
    try:
        cfg = build(yaml.safe_load((run_dir / "spec.yaml").read_text()))
    except ConfigError as exc:
        return False, f"{run_dir}: its spec is not valid for this code ({exc}): not comparable"
    if cfg.backend.name != "local":
        return False, f"{run_dir}: a {cfg.backend.name} run; only local runs are retrained here"
    if cfg.signature != ident["signature"]:
        return False, (f"{run_dir}: its spec has signature {cfg.signature} with this code, the folder's is "
                       f"{ident['signature']}: a run of other numerics or another spec layout, not comparable")
    client = MlflowClient(ident["tracking_uri"])
    run = active_run(client, ident.get("run_id"))
    if run is None:
        return False, f"{run_dir}: MLflow run {ident.get('run_id')} is not in the store {ident['tracking_uri']!r}"
    here, there = numerics.fingerprint()["key"], run.data.tags.get("numerics.key", "not recorded")
    other = "" if here == there else f" [stored under numerics '{there}', computed here under '{here}': bitwise " \
                                     "equality is promised only on the same key]"
    keys = [k for k in run.data.metrics if not k.startswith(SKIP)]
    stored: dict[int, dict[str, float]] = {}
    for key in keys:
        for m in client.get_metric_history(ident["run_id"], key):
            stored.setdefault(m.step, {})[key] = m.value
    logged = sum(1 for values in stored.values() if M.REWARD_MEAN in values)  # training steps (not the summary's)
    n = logged if steps == 0 else min(steps, logged)
    trainer = LocalTrainer(cfg, torch.device("cpu"))
    compared, differ, first = 0, 0, None
    for step in range(n):
        for key, value in trainer.run_step().items():
            if key not in stored.get(step, {}):
                continue
            got, want = float(value), stored[step][key]
            compared += 1
            if not (got == want or (got != got and want != want)):
                differ += 1
                first = first or f"first at step {step}: {key} {got!r} here, {want!r} stored"
    line = (f"{run_dir}: {cfg.estimator.name} seed {cfg.seed}, {n} steps, {compared} values compared, "
            f"{differ} differ" + (f" ({first})" if first else "") + other)
    return differ == 0 and compared > 0, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=30, help="steps retrained per run (0 = every logged step)")
    args = ap.parse_args(argv)
    import torch

    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    ok = True
    for run_dir in args.run_dirs:
        good, line = check(run_dir, args.steps)
        ok &= good
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
