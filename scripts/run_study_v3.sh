#!/usr/bin/env bash
# Issue 31's confirmatory study (docs/preregistration.md): the two conditions in blocks of 4 seeds, alternating,
# so that an interrupted study leaves balanced blocks. Finished runs are skipped and interrupted ones resume, so this
# script can be started again at any time (it picks up where it stopped). At low priority (nice 19): other work on
# the machine goes first.
#   bash scripts/run_study_v3.sh                  # all 8 blocks (seeds 100-131)
#   BLOCKS="0 1" bash scripts/run_study_v3.sh     # the first two blocks only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BLOCKS=${BLOCKS:-"0 1 2 3 4 5 6 7"}
for b in $BLOCKS; do
  s=$((100 + 4 * b))
  seeds="[$s,$((s + 1)),$((s + 2)),$((s + 3))]"
  for sweep in v3_sparse v3_bias; do
    echo "== $(date -u +%FT%TZ) block $b: $sweep seeds=$seeds"
    nice -n 19 "$PY" -m harness.sweep "sweeps/$sweep.yaml" launcher=local "seeds=$seeds" --wait
  done
done
