#!/usr/bin/env bash
# Issue 31's study (docs/preregistration.md): first the two confirmatory conditions in blocks of 4 seeds,
# alternating, so that an interrupted study leaves balanced blocks; then the exploratory arms (section 7) on the first
# 12 seeds, in blocks of 4 too. Finished runs are skipped and interrupted ones resume, so this script can be started
# again at any time (it picks up where it stopped). At low priority (nice 19): other work on the machine goes first.
#   bash scripts/run_study_v3.sh                              # everything: 8 confirmatory blocks, 3 exploratory
#   BLOCKS="0 1" EXPLORE_BLOCKS="" bash scripts/run_study_v3.sh  # the first two confirmatory blocks only
#   SWEEPS=v3_bias EXPLORE_BLOCKS="" bash scripts/run_study_v3.sh  # one condition's blocks only (to complete it first)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BLOCKS=${BLOCKS-"0 1 2 3 4 5 6 7"}
EXPLORE_BLOCKS=${EXPLORE_BLOCKS-"0 1 2"}
SWEEPS=${SWEEPS-"v3_sparse v3_bias"}

block() {  # block NUMBER SWEEP...
  local s=$((100 + 4 * $1)) sweep
  local seeds="[$s,$((s + 1)),$((s + 2)),$((s + 3))]"
  shift
  for sweep in "$@"; do
    echo "== $(date -u +%FT%TZ) $sweep seeds=$seeds"
    nice -n 19 "$PY" -m harness.sweep "sweeps/$sweep.yaml" launcher=local "seeds=$seeds" --wait
  done
}

for b in $BLOCKS; do block "$b" $SWEEPS; done
for b in $EXPLORE_BLOCKS; do block "$b" v3_explore_sparse v3_explore_bias v3_engines; done
