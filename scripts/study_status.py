"""Issue 31's study: how far it is, without looking at any outcome (docs/preregistration.md section 6: before every run
of a condition is finished, only counts of finished runs are reported).

For each sweep of the study: runs finished / planned, and the seeds whose runs are finished in every arm of that
sweep (complete seeds: what a balanced partial analysis could use - none is made before the end). Prints a markdown
table (the status table of docs/results.md). Reads the store through ``python -m harness.status --json``.

    python scripts/study_status.py
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ("v3_sparse", "v3_bias", "v3_explore_sparse", "v3_explore_bias", "v3_engines")


def status(sweep: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "harness.status", f"sweeps/{sweep}.yaml", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def summary(rows: list[dict]) -> tuple[int, int, list[int]]:
    """(finished, planned, complete seeds) of one sweep's rows."""
    by_seed: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        seed = int(re.search(r"seed=(\d+)", r["run"]).group(1))
        by_seed[seed].append(r["state"] == "finished")
    done = sum(r["state"] == "finished" for r in rows)
    return done, len(rows), sorted(s for s, ok in by_seed.items() if all(ok))


def main() -> int:
    print("| sweep | runs finished / planned | seeds finished in every arm |")
    print("|---|---:|---|")
    for sweep in SWEEPS:
        done, planned, seeds = summary(status(sweep))
        span = f"{len(seeds)} ({seeds[0]}-{seeds[-1]})" if seeds else "0"
        print(f"| `{sweep}` | {done} / {planned} | {span} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
