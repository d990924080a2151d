#!/usr/bin/env bash
# Issue 42's study (docs/preregistration_v4.md). Stage A, the hazard map (sweeps/v4_map.yaml), in blocks of 4 seeds
# (block 0: seeds 200-203 in all 20 cells, block 1: 204-207), so an interrupted map leaves balanced blocks. Finished
# runs are skipped and interrupted ones resume from their checkpoints, so this script can be started again at any
# time. At low priority (nice 19): other work on the machine goes first.
#   bash scripts/run_study_v4.sh                 # stage A, both blocks
#   BLOCKS="0" bash scripts/run_study_v4.sh      # block 0 only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BLOCKS=${BLOCKS-"0 1"}

for b in $BLOCKS; do
  s=$((200 + 4 * b))
  seeds="[$s,$((s + 1)),$((s + 2)),$((s + 3))]"
  echo "== $(date -u +%FT%TZ) v4_map seeds=$seeds"
  nice -n 19 "$PY" -m harness.sweep sweeps/v4_map.yaml launcher=local "seeds=$seeds" --wait
done
