"""Benchmark: load and analyse 200 runs x 500 steps from a local sqlite MLflow store (target < 30 s).

    python benchmarks/analysis_load.py                       # builds the store once, then times
    python benchmarks/analysis_load.py --metrics all         # log the whole metric catalogue per step
    python benchmarks/analysis_load.py --runs 200 --steps 500 --store /tmp/analysis_bench --report

The store (10 groups x 20 seeds of synthetic curves with the harness's tags and metric names, a
third of them collapsing) is built once under ``--store`` and reused; building is not timed.
Timed, in a fresh process: importing the analysis stack, loading every run's full histories of the
metrics the report reads (``MlflowClient.get_metric_history``), computing every per-run measure
(smoothing, drop rule, ruptures change point, convergence) and the summary + probability-of-
improvement tables with their bootstrap CIs. ``--report`` also times the full report (figures
as PNG + PDF, files, no MLflow logging).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(store: Path, runs: int, steps: int, all_metrics: bool) -> str:
    from analysis.synthetic import SyntheticRun, curve, log_runs

    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'm.db'}"
    groups = [("rollout", {}), ("recompute", {}), ("tis", {"clip_c": 2.0, "level": "token"}),
              ("tis", {"clip_c": 2.0, "level": "sequence"}), ("mis", {"clip_c": 2.0, "level": "sequence"}),
              ("icepop", {}), ("r3", {}), ("mean_n", {"n": 4}), ("mean_n", {"n": 16}), ("rais", {})]
    seeds = max(1, runs // len(groups))
    made, t0 = 0, time.time()
    for g, (est, knobs) in enumerate(groups):
        batch = []
        for s in range(seeds):
            drop = (steps // 2 + 7 * s) if (g + s) % 3 == 0 else None
            batch.append(SyntheticRun(est, s, curve(steps, ramp=steps // 5, drop_at=drop, seed=1000 * g + s),
                                      all_metrics=all_metrics, **knobs))
        log_runs(uri, "bench", batch)
        made += len(batch)
        print(f"  built {made}/{seeds * len(groups)} runs ({time.time() - t0:.0f} s)", flush=True)
    return uri


def timed(uri: str, report_dir: str | None) -> dict:
    t0 = time.perf_counter()
    from analysis.config import AnalysisConfig
    from analysis.load import load_experiment
    from analysis.measures import measure_experiment
    from analysis.tables import poi_table, summary_table

    t1 = time.perf_counter()
    cfg = AnalysisConfig()
    exp = load_experiment("bench", uri)
    t2 = time.perf_counter()
    measures = measure_experiment(exp, cfg)
    t3 = time.perf_counter()
    summary_table(exp, measures, cfg)
    poi_table(exp, measures, cfg)
    t4 = time.perf_counter()
    out = {"runs": len(exp.runs), "steps": int(max(len(s) for s in exp.histories[cfg.reward_metric].values())),
           "collapsed": int(measures["collapsed"].sum()), "import_s": t1 - t0, "load_s": t2 - t1,
           "measures_s": t3 - t2, "tables_s": t4 - t3, "total_s": t4 - t0}
    if report_dir:
        from analysis.report import build_report

        build_report("bench", uri, report_dir, cfg, echo=None, log_to_mlflow=False)
        out["report_s"] = time.perf_counter() - t4
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--metrics", choices=("core", "all"), default="core",
                    help="core: the 4 metrics the report reads; all: the whole catalogue (a realistic store size)")
    ap.add_argument("--store", default="/tmp/analysis_bench", help="folder of the benchmark store (reused)")
    ap.add_argument("--report", action="store_true", help="also time the full report with figures")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    store = Path(args.store) / f"{args.runs}x{args.steps}-{args.metrics}"
    uri = f"sqlite:///{store / 'm.db'}"
    if args._child:
        print(json.dumps(timed(uri, str(store / "report") if args.report else None)))
        return 0
    if not (store / "m.db").exists() or not (store / "built").exists():
        print(f"building {args.runs} runs x {args.steps} steps ({args.metrics} metrics) in {store} ...", flush=True)
        import logging

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        build(store, args.runs, args.steps, args.metrics == "all")
        (store / "built").write_text("ok\n")
    cmd = [sys.executable, __file__, "--runs", str(args.runs), "--steps", str(args.steps), "--metrics", args.metrics,
           "--store", args.store, "--_child"] + (["--report"] if args.report else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{res['runs']} runs x {res['steps']} steps ({res['collapsed']} collapsed), fresh process:")
    for key in ("import_s", "load_s", "measures_s", "tables_s", "total_s", "report_s"):
        if key in res:
            print(f"  {key[:-2]:<9} {res[key]:6.2f} s")
    verdict = "OK" if res["total_s"] < 30 else "TOO SLOW"
    print(f"load + analyse: {res['total_s']:.1f} s (target < 30 s): {verdict}")
    return 0 if res["total_s"] < 30 else 1


if __name__ == "__main__":
    sys.exit(main())
