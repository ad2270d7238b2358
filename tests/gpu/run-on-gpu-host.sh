#!/usr/bin/env bash
# The GPU checks as run on a GPU host without Docker (torch with CUDA 13, nvidia-ml-py):
# the self-check's stream output for the fixtures, then tests/gpu. Writes to ${OUT:-.}.
set -uo pipefail
out="${OUT:-.}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -m pytest --version >/dev/null 2>&1 || pip install -q pytest
run() {  # name, then gpucheck arguments
  local name="$1"; shift
  local t0=$SECONDS
  python3 -m appliance.selfcheck "$@" --stream >"$out/$name.stream" 2>"$out/$name.err"
  echo "$name: rc=$? wall=$((SECONDS - t0)) s"
}
run h200_selfcheck_ddtree_ok --gpus 0 --algorithm DDTREE --block-size 8 --budget 32
run h200_selfcheck_dflash_ok --gpus 0 --algorithm DFLASH --block-size 8
count=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
all=$(seq -s, 0 $((count - 1)))
run h200_selfcheck_gpu_missing --gpus "$all,$count" --algorithm DDTREE --block-size 8 --budget 32
if [ "$count" -gt 1 ]; then
  nvidia-smi topo -m
  run "h200x${count}_selfcheck_ddtree_ok" --gpus "$all" --algorithm DDTREE --block-size 8 --budget 32
fi
python3 -m pytest tests/gpu --confcutdir=tests/gpu -p no:django -p no:cacheprovider -q 2>&1 | tail -15
