#!/usr/bin/env bash
# The kernels' GPU batch, run from the repository root on the CUDA machine (one device call):
#   bash tests/gpu/device_run.sh OUT_DIR [bench shapes, default 1.3b,6.7b]
# Links engine/ and kernels/ under lsp_dscoder/ (as an install would), then: the skinny GEMM microbenchmark,
# the fast path with and without it (tests/gpu/skinny_ab.py), the kernels' check, `lsp-dscoder bench`.
# Each step has its own time limit so that one slow step cannot cost the others' output.
set -u
out=${1:?OUT_DIR}
shapes=${2:-1.3b,6.7b}
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
step skinny "${SKINNY_S:-110}" python3 -m lsp_dscoder.kernels.check_skinny --budget-s "${SWEEP_S:-70}"
step ab "${AB_S:-120}" python3 -m tests.gpu.skinny_ab --reps 20
step bench "${BENCH_S:-200}" python3 -m lsp_dscoder bench --reps 10 --no-startup --shapes "$shapes"
step check "${CHECK_S:-70}" python3 -m lsp_dscoder.kernels.check_gpu --budget-s 0
