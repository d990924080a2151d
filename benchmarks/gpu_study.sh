#!/usr/bin/env bash
# Issue 41, item 1: a named sweep's whole pipeline (sweep -> MLflow sqlite store -> histories -> report) on one GPU
# machine that has torch (CUDA), pandas, scipy, statsmodels, matplotlib, seaborn, tqdm and filelock, but no MLflow,
# Hydra, submitit or ruptures, and no network.
#   here (network):  make gpu-wheels                       # .whl/study-cp312: the wheels that machine lacks (~20 MiB)
#   there:           bash benchmarks/gpu_study.sh sweeps/v4_map.yaml [OVERRIDE ...]   # carry .whl
#   a CPU check:     SMOKE=1 bash benchmarks/gpu_study.sh sweeps/tiny.yaml  (make gpu-wheels PYVER=3.11 first)
# 1. The carried wheels of every distribution the machine lacks are installed (no index, no dependencies resolved
#    there: `make gpu-wheels` resolved them together) into $SITE, put first on PYTHONPATH.
# 2. The sweep runs with backend.device=cuda (its own signature: never pooled with CPU runs of the spec; each run's
#    tag numerics.key names the GPU), seed packs of up to $PACK seeds per job (one pack per group of seeds), $PAR jobs
#    at a time on the one GPU. Store, run folders, checkpoints and warm-start cache under $MOE_RL_HOME (scratch,
#    not $OUT: checkpoints are large); a second call resumes from the checkpoints (on a GPU not bitwise: docs/speed.md).
# 3. Into $OUT (what the device call brings back): the histories (`analysis export`), the report
#    (`analysis report $REPORT_ARGS`), the sweep's status table, device.txt and timing.txt (wall seconds per part).
# A study longer than one device call (a call ends after at most 10 min, and its scratch with it): PARTS=DIR names the
# experiment's folder of archived parts (analysis/archive.py). Its runs are restored into the store first, as marks
# (tags and params: the sweep then trains only the others; the call's report covers its own runs), the sweep and its
# jobs stop after BUDGET_S seconds (default: no limit), and the runs it finished (also when the sweep failed)
# are archived as a new part into $OUT/parts (a copy of DIR plus the new part: copy the new file back into DIR and
# commit it). An interrupted run is lost with the scratch: BUDGET_S should leave a pack's run time before the call's
# limit. The parts keep the metrics of `scripts/run_study_v4.sh --metrics` (ARCHIVE_METRICS to choose others).
# A GPU run is not the CPU run of its spec (its own signature; the analysis refuses a cell or arm holding both), so a
# stage run on a GPU goes to an experiment and a parts folder of its own (`archive` refuses another experiment's):
#   PARTS=docs/results/v4_stage_b_gpu/parts BUDGET_S=480 bash benchmarks/gpu_study.sh sweeps/v4_stage_b.yaml \
#     experiment=v4_stage_b_gpu
set -euo pipefail
SWEEP=${1:?usage: bash benchmarks/gpu_study.sh SWEEP.yaml [OVERRIDE ...]}
shift
PY=${PY:-python3}
OUT=${OUT:-runs/gpu_study}
SITE=${SITE:-/tmp/study-site}
export MOE_RL_HOME=${MOE_RL_HOME:-/tmp/study-home}
export PYTHONUNBUFFERED=1
TAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEELS=${WHEELS:-.whl/study-$TAG}
if [ "${SMOKE:-0}" = 1 ]; then DEV=cpu; PACK=${PACK:-2}; PAR=${PAR:-2}
else DEV=cuda; PACK=${PACK:-512}; PAR=${PAR:-$(( $(nproc) < 12 ? $(nproc) : 12 ))}; fi
mkdir -p "$OUT" "$SITE" "$MOE_RL_HOME"
[ -d "$WHEELS" ] || { echo "gpu_study: no wheels in $WHEELS: run 'make gpu-wheels PYVER=${TAG:2:1}.${TAG:3}' where there is a network, and carry .whl" >&2; exit 2; }
clock() { date +%s.%N; }
t0=$(clock)

# 1. the missing distributions, from the carried wheels only
$PY benchmarks/carry_install.py "$WHEELS" "$SITE"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
t1=$(clock)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, mlflow, hydra, submitit, ruptures; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| mlflow', mlflow.__version__, '| cpus', __import__('os').cpu_count())"
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"; } | tee "$OUT/device.txt"
EXP=$($PY -c "import sys; from harness.launch.spec import load_spec; print(load_spec(sys.argv[1], sys.argv[2:]).experiment)" "$SWEEP" "$@")

# 2. the sweep (finished runs are skipped, interrupted ones resume), after the parts' runs are restored
if [ -n "${PARTS:-}" ] && compgen -G "$PARTS/part-*.json.gz" > /dev/null; then
  # the parts must be this experiment's (checked before anything trains); marks only: enough for the sweep to skip
  # them, ~25x faster than a full restore (a call's restore stays seconds as the stage grows)
  $PY -c "import sys; from analysis.archive import archived
try: archived(sys.argv[1], sys.argv[2])
except Exception as exc: sys.exit(f'gpu_study: {exc}')" "$PARTS" "$EXP" || exit 2
  $PY -m analysis restore --dir "$PARTS" --marks
fi
rc=0
timeout "${BUDGET_S:-0}" $PY -m harness.sweep "$SWEEP" launcher=local backend.device=$DEV "launcher.seeds_per_job=$PACK" \
  "launcher.array_parallelism=$PAR" "$@" --wait || rc=$?
if [ "$rc" = 124 ]; then  # its jobs (own sessions: submitit's local executor) would go on writing to the store
  pkill -9 -f "submitit.core._submit $MOE_RL_HOME/" || true
  echo "gpu_study: the sweep stopped after BUDGET_S=$BUDGET_S s (its jobs ended); the runs it finished are archived"
fi
if [ -n "${PARTS:-}" ]; then  # also when the sweep failed: what finished is kept
  mkdir -p "$OUT/parts"
  if [ -d "$PARTS" ]; then cp -n "$PARTS"/part-*.json.gz "$OUT/parts/" 2>/dev/null || true; fi
  $PY -m analysis archive --experiment "$EXP" --dir "$OUT/parts" \
    --metrics "${ARCHIVE_METRICS:-$(bash scripts/run_study_v4.sh --metrics)}"
fi
[ "$rc" = 0 ] || [ "$rc" = 124 ] || exit "$rc"
t2=$(clock)
$PY -m harness.status "$SWEEP" backend.device=$DEV "$@" > "$OUT/status.txt" 2>&1 || true

# 3. histories and report
mkdir -p "$OUT/$EXP"
$PY -m analysis export --experiment "$EXP" --out "$OUT/$EXP/histories.json.gz"
$PY -m analysis report --experiment "$EXP" --out "$OUT/$EXP" ${REPORT_ARGS:-}
t3=$(clock)
$PY -c "import sys; t = [float(x) for x in sys.argv[1:]]
for name, a, b in (('install', 0, 1), ('sweep', 1, 2), ('export+report', 2, 3), ('total', 0, 3)):
    print(f'{name} {t[b] - t[a]:.1f} s')" "$t0" "$t1" "$t2" "$t3" | tee "$OUT/timing.txt"
