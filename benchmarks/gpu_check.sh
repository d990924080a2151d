#!/usr/bin/env bash
# Issue 29's GPU check in one call on a bare GPU machine (torch with CUDA; no MLflow needed; Hydra's three wheels
# carried in .whl, see docs/speed.md "On one GPU"). Writes its tables under $OUT (default runs/gpu_check):
#   device.txt          the GPU, driver and torch
#   identity.txt        a seed alone vs in a pack of 8 on the GPU, and the pack trained twice, every logged value
#                       (gpu_pack_check.py)
#   pack_scaling.md     moe_tiny, recompute and mean_n (n = 8), packs of 1-256, GPU kernels per step counted
#   pack_scaling_ab.md  the same for recompute at packs 1, 32, 256 with the CPU's expert GEMMs (--dense off): the
#                       per-group grouped_mm and per-seed weight gradient the dense layout replaced, side by side
#   pack_scaling_big.md moe_small, recompute, packs of 1-32
# The supervised warm start is skipped (task.warmstart.max_steps=0, WS below): its cache is keyed by the torch build,
# so a bare machine would first compute every seed's (minutes for 256 seeds); a step's cost does not depend on what
# the weights hold. Each part has its own time limit, so one that hangs leaves the others' rows; SMOKE=1 runs it all tiny (a CPU test).
set -u
WS=task.warmstart.max_steps=0
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ "${SMOKE:-0}" = 1 ]; then
  DEV=cpu; PACKS="1 2"; AB_PACKS="1 2"; BIG_PACKS="1 2"; STEPS="--quick"
else
  DEV=cuda; PACKS="1 8 32 128 256"; AB_PACKS="1 32 256"; BIG_PACKS="1 8 32"; STEPS="--steps 4 --warmup 2"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$OUT/device.txt"
timeout 60 $PY benchmarks/gpu_pack_check.py --device $DEV --pack 8 --steps 3 $WS 2>&1 | tee "$OUT/identity.txt"
timeout 45 $PY benchmarks/gpu_pack_check.py --device $DEV --pack 8 --steps 3 --against again $WS 2>&1 \
  | tee -a "$OUT/identity.txt"
timeout 45 $PY benchmarks/gpu_pack_check.py --device $DEV --pack 8 --steps 2 $WS estimator=mean_n estimator.n=8 2>&1 \
  | tee -a "$OUT/identity.txt"
timeout 200 $PY benchmarks/pack_scaling.py --device $DEV --packs $PACKS $STEPS --kernels --overrides $WS 2>&1 \
  | tee "$OUT/pack_scaling.md"
timeout 90 $PY benchmarks/pack_scaling.py --device $DEV --packs $AB_PACKS $STEPS --kernels --dense off \
  --estimators estimator=recompute --overrides $WS 2>&1 | tee "$OUT/pack_scaling_ab.md"
timeout 90 $PY benchmarks/pack_scaling.py --device $DEV --packs $BIG_PACKS $STEPS --estimators estimator=recompute \
  --overrides model=moe_small $WS 2>&1 | tee "$OUT/pack_scaling_big.md"
