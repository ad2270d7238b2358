#!/usr/bin/env bash
# The real-engine rig: runs the real SGLang DDTree engine on this GPU host and records it.
#   bash tests/gpu/real-engine.sh [record|failures|all|fa3|probe|verify|bigload|RUN...]  (default: all)
# record: DDTREE, DFLASH and no speculation (triton), served, benchmarked and probed.
# failures: 101cd5bd0's crash, the recorded failure cases and the memory-calibration captures.
# Packages come at the flagship lock's versions: from $RIG_CARRY/site*.tar.xz (made by
# tests/gpu/realengine/build_carry.py where PyPI is reachable), else built here with pip.
# SGLang sources: $RIG_CARRY/sglang-<commit>.tar.gz, else $APPLIANCE_SGLANG_SRC_DIR (../shared/sglang-src).
# Writes $OUT/recordings-<phase>.tar.xz (one folder per run: tests/gpu/realengine/record.py says
# what is in it) and $OUT/rig.log; tests/gpu/realengine/README.md says how they become fixtures.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:-all}
stash=${RIG_STASH:-$HOME/stash}
carry=${RIG_CARRY:-.carry_re}
src_dir=${APPLIANCE_SGLANG_SRC_DIR:-../shared/sglang-src}
out=${OUT:-var/real-engine}
mkdir -p "$stash/runs" "$out"
exec > >(tee -a "$out/rig.log") 2>&1
# NVLink multicast stays off (a program that uses it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RIG_STASH=$stash RIG_DEADLINE=$(( $(date +%s) + ${RIG_BUDGET_S:-3600} ))
t0=$SECONDS
echo "rig $phase $(date -u +%FT%TZ); stash: $(ls "$stash" | tr '\n' ' ')"

# fa3's kernels (flash_ops, 1.1 GB) travel apart, sliced to bf16 sm_90 and xz'd (57 MiB):
# `fa3-stash` keeps the carried file for the next call on a warm machine.
if [ -f "$carry/flash_ops.slim.so.xz" ]; then mkdir -p "$stash/fa3" && cp "$carry/flash_ops.slim.so.xz" "$stash/fa3/"; fi
if [ "$phase" = fa3-stash ]; then ls -la "$stash/fa3"; exit 0; fi
unpack() {  # archive, marker
  [ -f "$stash/$2.ok" ] && return 0
  [ -f "$1" ] || return 1
  tar -xJf "$1" -C "$stash" && touch "$stash/$2.ok"
}
need101=0
case "$phase" in failures|all|ddtree101*) need101=1 ;; esac
if ! unpack "$carry/site.tar.xz" site; then
  python3 tests/gpu/realengine/build_carry.py "$stash/carry" && unpack "$stash/carry/site.tar.xz" site \
    || { echo "no packages: carry $carry/site.tar.xz or reach PyPI"; exit 2; }
fi
[ $need101 = 1 ] && { unpack "$carry/site101.tar.xz" site101 || unpack "$stash/carry/site101.tar.xz" site101; }
for commit in 433c58ed70cd1dabe5a07a83da12f1513cd599ae 101cd5bd02faab336ada94f78daada6288c1816e; do
  [ -f "$stash/s-$commit.ok" ] && continue
  for dir in "$carry" "$src_dir"; do
    if [ -f "$dir/sglang-$commit.tar.gz" ]; then
      tar -xzf "$dir/sglang-$commit.tar.gz" -C "$stash" && touch "$stash/s-$commit.ok"; break
    fi
  done
done
if [ -f "$stash/fa3/flash_ops.slim.so.xz" ] && [ ! -f "$stash/site/sgl_kernel/flash_ops.abi3.so" ]; then
  xz -dc "$stash/fa3/flash_ops.slim.so.xz" > "$stash/site/sgl_kernel/flash_ops.abi3.so"
fi
if [ ! -f "$stash/models.ok" ]; then
  PYTHONPATH="$stash/site" python3 tests/gpu/realengine/models.py "$stash/models" && touch "$stash/models.ok"
fi
case " $* " in *bigload*)
  if [ ! -f "$stash/big.ok" ]; then
    PYTHONPATH="$stash/site" python3 tests/gpu/realengine/models.py "$stash/models" --big && touch "$stash/big.ok"
  fi ;;
esac
echo "packages, sources, models: $((SECONDS - t0)) s"
if [ ! -f "$stash/env.ok" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  PYTHONPATH="$stash/site:$stash/stubs" python3 -c "
import importlib.metadata as m
print(' '.join(f'{p}=={m.version(p)}' for p in ('torch', 'triton', 'transformers', 'tokenizers', 'sglang-kernel', 'aiohttp')))"
  touch "$stash/env.ok"
fi

case "$phase" in
  record) runs="ddtree_triton dflash_triton base_triton" ;;
  failures) runs="ddtree101_triton missing_model kv_too_small tree_backend_unsupported drafter_hidden_mismatch capture_oom ddtree_triton_bs16 dflash_triton_bs16 ddtree_triton_ctx32k" ;;
  all) runs="ddtree_triton dflash_triton base_triton ddtree101_triton missing_model kv_too_small tree_backend_unsupported drafter_hidden_mismatch capture_oom ddtree_triton_bs16 dflash_triton_bs16 ddtree_triton_ctx32k" ;;
  fa3) runs="ddtree_fa3 dflash_fa3" ;;
  probe) runs="ddtree_probe dflash_probe ddtree_triton_ctx32k tree_backend_unsupported" ;;
  verify) runs="verify_ddtree_base" ;;
  bigload) runs="bigload_triton" ;;
  *) runs="$*" ;;
esac
for run in $runs; do
  if [ -f "$stash/runs/$run/run.json" ]; then echo "[$run] recorded earlier"; continue; fi
  left=$(( RIG_DEADLINE - $(date +%s) ))
  if [ $left -lt 75 ]; then echo "[$run] skipped: $left s left"; continue; fi
  python3 tests/gpu/realengine/record.py "$run" "$stash/runs"
done
tar -cJf "$out/recordings-$phase.tar.xz" -C "$stash/runs" . && ls -la "$out"
echo "rig $phase end after $((SECONDS - t0)) s"
