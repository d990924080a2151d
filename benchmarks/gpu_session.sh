#!/usr/bin/env bash
# A lent GPU's one call (15 minutes of device time per session, at most 10 a call): issue 41's GPU numbers, measured,
# and issue 42's positive control replicated on the GPU through the whole study pipeline.
#   here (network):  make gpu-wheels                    # .whl/study-cp312 (the wheels a bare GPU machine lacks)
#   there:           bash benchmarks/gpu_session.sh     # the device tool: carry [".whl"], timeout_s 590
#   a CPU check:     SMOKE=1 bash benchmarks/gpu_session.sh   (tiny; tests/benchmarks/test_gpu_session.py)
# Each part has its own time limit, cut to what is left before a deadline (570 s after the start, install included;
# `timeout -k 5`), so a part that hangs leaves the others' tables and the call ends in time. Into $OUT
# (default runs/gpu_session; what the call brings back):
#   device.txt         the GPU, driver, torch, commit
#   setup.md           item 2: packs of 1, 64 and 512 seeds (recompute) set up from an empty warm-start cache, their
#                      warm starts computed together on the GPU (`set-up s`), then their step time (pack_scaling.py)
#   throughput.md      item 3: recompute and mean_n (n=8) at packs of 256 and 512 with today's kernels (no CUDA graphs,
#                      no torch.compile): the baseline any such change is measured against
#   deterministic.md   item 4: recompute at a pack of 256 with backend.deterministic=true, beside throughput.md's
#                      default row: the price of the deterministic kernels
#   identity.txt       item 4: the same pack trained twice, deterministic and not (gpu_pack_check.py --against again)
#   resume.txt         item 4: a deterministic run interrupted and resumed vs the same run straight (resume_check.py)
#   study/             items 1 and 6: gpu_study.sh on sweeps/v4_positive.yaml as experiment v4_positive_gpu (recompute
#                      vs mean_8, dense sigma-1 noise, 32 paired seeds, 300 + 30 steps), stopped after $STUDY_S s:
#                      histories, report, status, wall time per part, and its finished runs as a part (parts/)
#   timing.txt         the wall seconds of each part
set -u
PY=${PY:-python3}
OUT=${OUT:-runs/gpu_session}
SITE=${SITE:-/tmp/study-site}
export MOE_RL_HOME=${MOE_RL_HOME:-/tmp/study-home}
export PYTHONUNBUFFERED=1
TAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEELS=${WHEELS:-.whl/study-$TAG}
if [ "${SMOKE:-0}" = 1 ]; then
  DEV=cpu; SETUP_PACKS="1 2"; PACKS="1 2"; DET_PACK=2; RUN="--quick"; STUDY=sweeps/tiny.yaml; STUDY_S=${STUDY_S:-120}
  SMALL=(trainer.prompts_per_step=4 trainer.group_size=4 trainer.num_minibatches=2 diagnostics.noise_sequences=4
         task.warmstart.max_steps=5)
  STUDY_ARGS=(trainer.steps=4)
else
  DEV=cuda; SETUP_PACKS="1 64 512"; PACKS="256 512"; DET_PACK=256; RUN="--steps 3 --warmup 1"
  STUDY=sweeps/v4_positive.yaml; STUDY_S=${STUDY_S:-130}; SMALL=(); STUDY_ARGS=(experiment=v4_positive_gpu)
fi
mkdir -p "$OUT" "$SITE" "$MOE_RL_HOME"
[ -d "$WHEELS" ] || { echo "gpu_session: no wheels in $WHEELS: run 'make gpu-wheels PYVER=${TAG:2:1}.${TAG:3}' where there is a network, and carry .whl" >&2; exit 2; }
$PY benchmarks/carry_install.py "$WHEELS" "$SITE" || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
: > "$OUT/timing.txt"
DEADLINE=${DEADLINE_S:-570}  # seconds from the start by which every part has ended (the device call: 590)
part() {  # part NAME LIMIT_S OUTFILE COMMAND...: the command under its limit (and the deadline), output into OUTFILE
  local name=$1 limit=$2 file=$3; shift 3
  local t0=$SECONDS left=$((DEADLINE - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then echo "$name skipped: the call's deadline" | tee -a "$OUT/timing.txt"; return; fi
  echo "== $name (at most ${limit} s)"
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$file"
  local rc=${PIPESTATUS[0]}
  echo "$name $((SECONDS - t0)) s (exit $rc)" | tee -a "$OUT/timing.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"; } | tee "$OUT/device.txt"

part setup 110 setup.md $PY benchmarks/pack_scaling.py --device $DEV --packs $SETUP_PACKS $RUN --cold \
  --estimators estimator=recompute --overrides "${SMALL[@]}"
part throughput 100 throughput.md $PY benchmarks/pack_scaling.py --device $DEV --packs $PACKS $RUN --kernels \
  --overrides "${SMALL[@]}"
part deterministic 50 deterministic.md $PY benchmarks/pack_scaling.py --device $DEV --packs $DET_PACK $RUN \
  --estimators estimator=recompute --overrides backend.deterministic=true "${SMALL[@]}"
part identity 45 identity.txt bash -c "$PY benchmarks/gpu_pack_check.py --device $DEV --pack 8 --steps 3 --against again backend.deterministic=true ${SMALL[*]} && $PY benchmarks/gpu_pack_check.py --device $DEV --pack 8 --steps 3 --against again ${SMALL[*]}"
part resume 50 resume.txt $PY benchmarks/resume_check.py --device $DEV --steps 8 --stop 5 --every 3 \
  backend.deterministic=true "${SMALL[@]}"
left=$((DEADLINE - SECONDS - 60))  # the study's sweep stops in time for its archive, export and report (~60 s)
[ "$left" -lt "$STUDY_S" ] && STUDY_S=$left
part study $((STUDY_S + 60)) study.txt env OUT="$OUT/study" SITE="$SITE" WHEELS="$WHEELS" PY="$PY" \
  PARTS="$OUT/none" BUDGET_S="$STUDY_S" bash benchmarks/gpu_study.sh $STUDY "${STUDY_ARGS[@]}"
cat "$OUT/timing.txt"
