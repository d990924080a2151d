#!/usr/bin/env bash
# Issue 42's study (docs/preregistration_v4.md), stage by stage, in blocks of seeds across all cells or arms, so an
# interrupted stage leaves balanced blocks. Finished runs are skipped and interrupted ones resume from their
# checkpoints, so this script can be started again at any time. At low priority (nice 19): other work goes first.
#   stage A (default), the hazard map, sweeps/v4_map.yaml: blocks of 4 seeds (block 0: seeds 200-203 in all 20
#     cells, block 1: 204-207);
#   STAGE=b, confirmatory, sweeps/v4_stage_b.yaml (written by scripts/v4_stage_b.py once stage A chose its cell):
#     blocks of 8 seeds across all 10 arms (block 0: seeds 400-407, ...).
# A stage outlives its store (stage A ~4.6 h on 2 cores, stage B days; a working session is shorter, and a new
# checkout has no mlruns.db): the finished runs are archived as parts in docs/results/<experiment>/parts
# (analysis/archive.py; commit them), and a new checkout's store gets them back first (`analysis restore`), so only
# the runs no part holds are trained.
#   bash scripts/run_study_v4.sh                 # stage A, every block
#   BLOCKS="0" bash scripts/run_study_v4.sh      # block 0 only
#   STAGE=b bash scripts/run_study_v4.sh         # stage B, every block
#   bash scripts/run_study_v4.sh --archive       # archive the runs finished so far (a new part), train nothing
#   bash scripts/run_study_v4.sh --metrics       # the metrics the parts keep (the Makefile's V4_METRICS)
#   STAGE=b bash scripts/run_study_v4.sh --verdicts  # stage B's verdicts: the survival command of its sweep's header
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# what stage A's analysis, the survival verdicts, the along-training tables and `report --from` read
# (tests/analysis/test_study_export.py)
METRICS=reward/mean,policy/loss,mismatch/rec_k3,mismatch/k3,mismatch/abs_diff,noise/var_rollout,moe/routing_flip_rate,perturb/level,perturb/scale,policy/update_norm,policy/grad_norm,policy/clipfrac,time/step_s,moe/replay_coverage
case "${STAGE:-a}" in
  a|A) SWEEP=sweeps/v4_map.yaml; EXP=v4_map; FIRST=200; BLOCK=4 ;;
  b|B) SWEEP=sweeps/v4_stage_b.yaml; EXP=v4_stage_b; FIRST=400; BLOCK=8 ;;
  *) echo "error: STAGE must be a or b, got '$STAGE'" >&2; exit 2 ;;
esac
PARTS=docs/results/$EXP/parts

archive() { "$PY" -m analysis archive --experiment "$EXP" --dir "$PARTS" --metrics "$METRICS"; }
verdicts() {  # the survival command the sweep's header declares, verbatim (its quoted --pair labels kept whole)
  local args
  args=$(sed -n 's/^#   python -m analysis survival //p' "$SWEEP" 2>/dev/null || true)
  [ -n "$args" ] || { echo "error: $SWEEP: its header declares no '#   python -m analysis survival ...' command (stage B's sweep does)" >&2; exit 2; }
  eval "set -- $args"
  "$PY" -m analysis survival "$@"
}
case "${1-}" in
  --metrics) echo "$METRICS"; exit 0 ;;
  --archive) archive; exit 0 ;;
  --verdicts) verdicts; exit 0 ;;
  "") ;;
  *) echo "usage: [STAGE=a|b] [BLOCKS=\"0 1 ...\"] bash scripts/run_study_v4.sh [--archive|--metrics|--verdicts]" >&2; exit 2 ;;
esac
[ -f "$SWEEP" ] || { echo "error: no $SWEEP: stage B's sweep is written by scripts/v4_stage_b.py from stage A's cell (docs/preregistration_v4.md)" >&2; exit 2; }
SEEDS=$("$PY" -c "import sys; from harness.launch.spec import load_spec; print(len(load_spec(sys.argv[1]).seeds))" "$SWEEP")
BLOCKS=${BLOCKS-$(seq -s " " 0 $(( (SEEDS + BLOCK - 1) / BLOCK - 1 )))}
NBLOCKS=$(( (SEEDS + BLOCK - 1) / BLOCK ))
for b in $BLOCKS; do
  [[ "$b" =~ ^[0-9]+$ ]] && [ "$b" -lt "$NBLOCKS" ] || { echo "error: BLOCKS: '$b' is not a block of $SWEEP (0..$((NBLOCKS - 1)))" >&2; exit 2; }
done

if compgen -G "$PARTS/part-*.json.gz" > /dev/null; then
  # the parts' runs stand for runs not trained again: they must be this machine's numerics (else the stage mixes two)
  "$PY" scripts/parts_numerics.py "$PARTS" || exit 2
  "$PY" -m analysis restore --dir "$PARTS" --marks  # enough to skip them (~25x faster); the analysis reads the parts
fi
for b in $BLOCKS; do
  s=$((FIRST + BLOCK * b))
  last=$((s + BLOCK - 1)); [ "$last" -lt $((FIRST + SEEDS)) ] || last=$((FIRST + SEEDS - 1))
  seeds="[$(seq -s , "$s" "$last")]"
  echo "== $(date -u +%FT%TZ) $EXP seeds=$seeds"
  nice -n 19 "$PY" -m harness.sweep "$SWEEP" launcher=local "seeds=$seeds" --wait || { archive || true; exit 1; }  # what finished is kept
  archive
done
