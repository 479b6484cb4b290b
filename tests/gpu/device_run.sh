#!/usr/bin/env bash
# The kernels' GPU batch, run from the repository root on the CUDA machine (one device call):
#   bash tests/gpu/device_run.sh OUT_DIR [bench shapes, default 1.3b,6.7b,33b]
# Links engine/ and kernels/ under lsp_dscoder/ (as an install would), then: the decode step kernel by
# kernel with the fused variants (tests/gpu/step_profile.py), the attention sweep, the engine bench (random
# weights built on the GPU, `lsp-dscoder bench`'s options), the kernels' check.
# Each step has its own time limit so that one slow step cannot cost the others' output.
set -u
out=${1:?OUT_DIR}
shapes=${2:-1.3b,6.7b,33b}
ln -sfn ../engine lsp_dscoder/engine
ln -sfn ../kernels lsp_dscoder/kernels
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s)"
  local t=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - t)) s"
  tail -n 60 "$out/$name.log"
}
step profile "${PROFILE_S:-60}" python3 -m tests.gpu.step_profile --shapes 1.3b,6.7b --out "$out"
step attn "${ATTN_S:-60}" python3 -m tests.gpu.attn_sweep --budget-s "${SWEEP_S:-50}" --out "$out"
step bench "${BENCH_S:-200}" python3 -m lsp_dscoder.bench_engine --reps 10 --no-startup --shapes "$shapes"
step check "${CHECK_S:-70}" python3 -m lsp_dscoder.kernels.check_gpu --budget-s 0
