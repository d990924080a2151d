"""``python -m harness.demo``: the default local experiment, end to end.

Every estimator x ``--seeds`` seeds on the default spec (``experiments/config.yaml``), runs in
parallel (``--workers``, one torch thread each), logged to the MLflow experiment ``--experiment``;
ends with a summary table per estimator, then the analysis report over what it just trained
(``python -m analysis report --experiment <experiment>``: tables, figures, report.md). Extra ``key=value`` arguments override the spec of every
run (e.g. ``trainer.steps=50``). Finished runs (same signature) are not recomputed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

from harness.config import ESTIMATORS, ConfigError, load


def _one(overrides: list[str]):
    from harness.run import execute

    cfg = load(overrides)
    return cfg.estimator.name, cfg.seed, execute(cfg, progress=False)


def table(results: list[tuple[str, int, object]]) -> str:
    rows = ["| estimator | seeds | final reward (mean ± sd) | peak | diverged | s/step |", "|---|---|---|---|---|---|"]
    for name in ESTIMATORS:
        rs = [s for e, _, s in results if e == name]
        if not rs:
            continue
        finals = [s.final_reward for s in rs]
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        rows.append(f"| {name} | {len(rs)} | {statistics.fmean(finals):.3f} ± {sd:.3f} | "
                    f"{statistics.fmean(s.peak_reward for s in rs):.3f} | "
                    f"{sum(s.status == 'diverged' for s in rs)}/{len(rs)} | "
                    f"{statistics.fmean(s.time_per_step_s for s in rs):.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--experiment", default="demo")
    ap.add_argument("--estimators", default=",".join(ESTIMATORS))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    jobs = []
    try:
        for name in args.estimators.split(","):
            for seed in range(args.seeds):
                ov = [f"estimator={name}", f"seed={seed}", f"tracking.experiment={args.experiment}", *args.overrides]
                load(ov)  # validate every run before starting any
                jobs.append(ov)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[demo] {len(jobs)} runs ({args.estimators} x {args.seeds} seeds), {args.workers} at a time, "
          f"MLflow experiment '{args.experiment}'", flush=True)
    results = []
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_one, ov) for ov in jobs]
        for fut in as_completed(futures):
            name, seed, summary = fut.result()
            results.append((name, seed, summary))
            print(f"[{len(results)}/{len(jobs)}] {name} seed={seed}: {summary.status}, "
                  f"final {summary.final_reward:.3f}, {summary.time_per_step_s:.2f} s/step", flush=True)
    print()
    print(table(results))
    uri = load(jobs[0]).tracking_uri
    print(f"\n[demo] analysis: python -m analysis report --experiment {args.experiment}", flush=True)
    from analysis.__main__ import main as analysis_main

    rc = analysis_main(["report", "--experiment", args.experiment, "--tracking-uri", uri])
    print(f"\nAll runs: mlflow ui --backend-store-uri {uri}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
