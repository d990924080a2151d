#!/usr/bin/env bash
# Issue 42's study (docs/preregistration_v4.md). Stage A, the hazard map (sweeps/v4_map.yaml), in blocks of 4 seeds
# (block 0: seeds 200-203 in all 20 cells, block 1: 204-207), so an interrupted map leaves balanced blocks. Finished
# runs are skipped and interrupted ones resume from their checkpoints, so this script can be started again at any
# time. At low priority (nice 19): other work on the machine goes first.
# The map outlives its store (~4.6 h on 2 cores, longer than a working session; a new checkout has no mlruns.db): the
# finished runs are archived as parts in docs/results/v4_map/parts (analysis/archive.py; commit them), and a new
# checkout's store gets them back first (`analysis restore`), so only the runs no part holds are trained.
#   bash scripts/run_study_v4.sh                 # stage A, both blocks
#   BLOCKS="0" bash scripts/run_study_v4.sh      # block 0 only
#   bash scripts/run_study_v4.sh --archive       # archive the runs finished so far (a new part), train nothing
#   bash scripts/run_study_v4.sh --metrics       # the metrics the parts keep (the Makefile's V4_METRICS)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BLOCKS=${BLOCKS-"0 1"}
PARTS=docs/results/v4_map/parts
# what stage A's analysis, the along-training tables and `report --from` read (tests/analysis/test_study_export.py)
METRICS=reward/mean,policy/loss,mismatch/rec_k3,mismatch/k3,mismatch/abs_diff,noise/var_rollout,moe/routing_flip_rate,perturb/level,perturb/scale,policy/update_norm,policy/grad_norm,policy/clipfrac,time/step_s,moe/replay_coverage

archive() { "$PY" -m analysis archive --experiment v4_map --dir "$PARTS" --metrics "$METRICS"; }
case "${1-}" in
  --metrics) echo "$METRICS"; exit 0 ;;
  --archive) archive; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/run_study_v4.sh [--archive|--metrics]" >&2; exit 2 ;;
esac

if compgen -G "$PARTS/part-*.json.gz" > /dev/null; then
  "$PY" -m analysis restore --dir "$PARTS"
fi
for b in $BLOCKS; do
  s=$((200 + 4 * b))
  seeds="[$s,$((s + 1)),$((s + 2)),$((s + 3))]"
  echo "== $(date -u +%FT%TZ) v4_map seeds=$seeds"
  nice -n 19 "$PY" -m harness.sweep sweeps/v4_map.yaml launcher=local "seeds=$seeds" --wait
  archive
done
