#!/usr/bin/env bash
# The real-engine rig: runs the real SGLang DDTree engine on this GPU host and records it.
#   bash tests/gpu/real-engine.sh [PHASE | WAVE...]   (default: all)
# PHASE: record | failures | all | fa3 | probe | verify | bigload | round2 | int4 | train |
#   trained | tune | refusals523 (below).
# WAVE: runs of tests/gpu/realengine/runs.py, comma-separated to start them together on the
#   one GPU (each on its own port, KV pools capped), e.g. `missing_model,kv_too_small base_triton`
#   is two waves, one after the other.
# Environment:
#   RIG_BUDGET_S  seconds this call may take (default 3600). Every phase keeps to it: a wave
#                 that cannot finish in what is left is not started, a run's start, probe,
#                 bench and refusals stop in time for its engine to be stopped before it.
#   RIG_CARRY     folder with what a host without network needs (default .carry_re):
#                 site.tar.xz, site101.tar.xz, grammar.tar.xz and sglang-<commit>.tar.gz, made by
#                 tests/gpu/realengine/build_carry.py where PyPI is reachable.
#   RIG_STASH     where packages, models and recordings are kept between calls ($HOME/stash).
#   APPLIANCE_SGLANG_SRC_DIR  SGLang snapshots when not in RIG_CARRY (../shared/sglang-src).
#   RIG_TRAIN_S   seconds train_pair.py may take (default 500): the trained pair is made by the
#                 `train` and `trained` phases when the stash lacks it (`tune`: 200, with
#                 RIG_TRAIN_ARGS, default `--target-share 0.4 --b-steps 10 --prompts 512
#                 --drafter-min-s 30`).
#   RIG_TUNE_ARGS  more arguments for tune_rig.py (`tune`), e.g. `--sweep-prompts 48`.
#   refusals523: sglang 0.5.23 (PyPI) from RIG_CARRY/site523.tar.xz (default carry .carry_523,
#                 build_carry.py --release 0.5.23), the trained pair trained first as `tune`
#                 trains it (RIG_TRAIN_S default 150), then the refusal set on DFLASH.
# Packages come at the flagship lock's versions: from $RIG_CARRY/site*.tar.xz, else built here
# with pip (build_carry.py). SGLang sources: $RIG_CARRY/sglang-<commit>.tar.gz, else
# $APPLIANCE_SGLANG_SRC_DIR: a host without ../shared (a device machine that gets only the
# checkout) needs the tarball in the carry.
# Writes $OUT/recordings-<phase>.tar.xz (one folder per run: tests/gpu/realengine/record.py says
# what is in it) and $OUT/rig.log; tests/gpu/realengine/README.md says how they become fixtures.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:-all}
stash=${RIG_STASH:-$HOME/stash}
# The site the phase's engines run: 433c58ed7's packages (site), or sglang 0.5.23's own (site523).
site=site default_carry=.carry_re
case " $* " in *" refusals523"*) site=site523 default_carry=.carry_523 ;; esac
carry=${RIG_CARRY:-$default_carry}
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
# The trained pair (a Qwen3 target, a second one, their DFlash drafter), trained here from fixed
# seeds on this host's own Python sources with the host's torch: realengine/README.md.
case "$phase" in train|trained)
  if [ ! -f "$stash/trained.ok" ]; then
    mkdir -p "$stash/models"
    PYTHONUNBUFFERED=1 python3 tests/gpu/realengine/train_pair.py "$stash/models" \
        --seconds "${RIG_TRAIN_S:-500}" ${RIG_TRAIN_ARGS:-} --report "$out/train.json" \
      && touch "$stash/trained.ok" || { echo "training failed"; exit 3; }
  fi
  [ "$phase" = train ] && { echo "rig train end after $((SECONDS - t0)) s"; exit 0; } ;;
# `tune` and `refusals523` train in the background (a shorter budget: RIG_TRAIN_S,
# RIG_TRAIN_ARGS) while the packages unpack, and wait for it before their engines start.
tune|refusals523)
  if [ ! -f "$stash/trained.ok" ]; then
    mkdir -p "$stash/models"
    train_s=200; [ "$phase" = refusals523 ] && train_s=150
    ( PYTHONUNBUFFERED=1 python3 tests/gpu/realengine/train_pair.py "$stash/models" \
        --seconds "${RIG_TRAIN_S:-$train_s}" ${RIG_TRAIN_ARGS:---target-share 0.4 --b-steps 10 --prompts 512 --drafter-min-s 30} \
        --report "$out/train.json" > "$out/train.log" 2>&1 && touch "$stash/trained.ok" ) &
    train_pid=$!
  fi ;;
esac
unpack() {  # archive, marker
  [ -f "$stash/$2.ok" ] && return 0
  [ -f "$1" ] || return 1
  tar -xJf "$1" -C "$stash" && touch "$stash/$2.ok"
}
need101=0
case "$phase" in failures|all|ddtree101*) need101=1 ;; esac
if ! unpack "$carry/$site.tar.xz" "$site"; then
  only=(--only 433c58ed7 --grammar); [ $need101 = 1 ] && only=(--grammar)
  [ "$site" = site523 ] && only=(--release 0.5.23)
  python3 tests/gpu/realengine/build_carry.py "$stash/carry" "${only[@]}" \
    && unpack "$stash/carry/$site.tar.xz" "$site" \
    || { echo "no packages: carry $carry/$site.tar.xz or reach PyPI"; exit 2; }
fi
# The checkout's stubs win over those packed into the carry when it was built (stubs523 is
# stubs/ and stubs523/ as they were then, with flashinfer's JIT headers).
[ "$site" = site523 ] && cp -r tests/gpu/realengine/stubs/. tests/gpu/realengine/stubs523/. "$stash/stubs523/"
[ $need101 = 1 ] && { unpack "$carry/site101.tar.xz" site101 || unpack "$stash/carry/site101.tar.xz" site101; }
# The rig's own driver imports the checkout's `appliance`, which imports the Docker SDK: the host
# lacks it, pydeps.tar.xz brings it (build_carry.py).
unpack "$carry/pydeps.tar.xz" pydeps || unpack "$stash/carry/pydeps.tar.xz" pydeps \
  || echo "no pydeps.tar.xz: record.py needs the docker package"
export PYTHONPATH="$stash/pydeps${PYTHONPATH:+:$PYTHONPATH}"
# xgrammar unpacks into site/ (runs with grammar requests; the others pass --grammar-backend none).
# site523 holds its own (the release's lock's version).
[ "$site" = site ] && { unpack "$carry/grammar.tar.xz" grammar || unpack "$stash/carry/grammar.tar.xz" grammar \
  || echo "no grammar.tar.xz: runs that need xgrammar will fail to start"; }
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
if [ ! -f "$stash/models.ok" ] && [ "$phase" != tune ]; then
  PYTHONPATH="$stash/$site" python3 tests/gpu/realengine/models.py "$stash/models" && touch "$stash/models.ok"
fi
case " $* " in *bigload*)
  if [ ! -f "$stash/big.ok" ]; then
    PYTHONPATH="$stash/site" python3 tests/gpu/realengine/models.py "$stash/models" --big && touch "$stash/big.ok"
  fi ;;
esac
echo "packages, sources, models: $((SECONDS - t0)) s"
if [ ! -f "$stash/env-$site.ok" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  stubs=stubs; [ "$site" = site523 ] && stubs=stubs523
  PYTHONPATH="$stash/$site:$stash/$stubs" python3 -c "
import importlib.metadata as m
print(' '.join(f'{p}=={m.version(p)}' for p in ('torch', 'triton', 'transformers', 'tokenizers', 'sglang-kernel', 'aiohttp', 'compressed-tensors', 'xgrammar')))"
  PYTHONPATH="$stash/$site:$stash/$stubs" python3 -c "import xgrammar; print('xgrammar imports')" 2>&1 | tail -3
  # 0.5.23's engine imports, on the host's torch with the carried kernel: the first error here
  # is the one its runs would stop at.
  [ "$site" = site523 ] && SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 PYTHONPATH="$stash/$site:$stash/$stubs" \
    python3 -c "import sglang, sgl_kernel, sglang.launch_server; print('sglang', sglang.__version__, 'imports')" 2>&1 | tail -5
  # 0.5.23's DFLASH sampling prewarm JIT-builds a kernel with the host's nvcc (CUDA_HOME, else
  # nvcc on PATH, else /usr/local/cuda) against the carried flashinfer headers.
  [ "$site" = site523 ] && { nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    echo "nvcc: $nvcc $("$nvcc" --version 2>&1 | tail -1); flashinfer headers: $(ls "$stash/stubs523/flashinfer/data" 2>&1 | tr '\n' ' ')"; }
  touch "$stash/env-$site.ok"
fi

# refusals523 waits for its trained pair (trained in the background above).
if [ "$phase" = refusals523 ] && [ -n "${train_pid:-}" ]; then
  wait "$train_pid"; tail -4 "$out/train.log"
  [ -f "$stash/trained.ok" ] || { echo "training failed"; tail -30 "$out/train.log"; exit 3; }
  echo "trained after $((SECONDS - t0)) s"
fi
# Tune (tests/gpu/realengine/tune_rig.py): appliance.tune's run_tune over the trained pair's
# engines (all five started at once, each measured alone), then the exhaustive sweep of the
# same candidates; tune.json, sweep.json and the engines' logs into $OUT.
if [ "$phase" = tune ]; then
  if [ -n "${train_pid:-}" ]; then
    wait "$train_pid"
    tail -4 "$out/train.log"
  fi
  [ -f "$stash/trained.ok" ] || { echo "training failed"; tail -30 "$out/train.log"; exit 3; }
  echo "trained after $((SECONDS - t0)) s"
  rm -rf "$stash/tune"
  PYTHONUNBUFFERED=1 python3 tests/gpu/realengine/tune_rig.py "$stash/tune" \
      --models "$stash/models" --results "$out" ${RIG_TUNE_ARGS:-}
  rc=$?
  tar -cJf "$out/tune-engines.tar.xz" -C "$stash/tune" engines 2>/dev/null
  ls -la "$out"
  echo "rig tune end after $((SECONDS - t0)) s (rc $rc)"
  exit $rc
fi

# A phase is a list of waves; the runs of a wave (commas) start together.
case "$phase" in
  record) waves="ddtree_triton dflash_triton base_triton" ;;
  failures) waves="ddtree101_triton missing_model kv_too_small tree_backend_unsupported drafter_hidden_mismatch capture_oom ddtree_triton_bs16 dflash_triton_bs16 ddtree_triton_ctx32k" ;;
  all) waves="ddtree_triton dflash_triton base_triton ddtree101_triton missing_model kv_too_small tree_backend_unsupported drafter_hidden_mismatch capture_oom ddtree_triton_bs16 dflash_triton_bs16 ddtree_triton_ctx32k" ;;
  fa3) waves="ddtree_fa3 dflash_fa3" ;;
  probe) waves="ddtree_probe dflash_probe ddtree_triton_ctx32k tree_backend_unsupported" ;;
  verify) waves="verify_ddtree_base" ;;
  bigload) waves="bigload_triton" ;;
  # The second round: the failures and warnings the appliance misread, and the refusals (bf16),
  # all at once; then Kimi K2.6's INT4 checkpoint format, each served alone.
  round2) waves="drafter_missing,tp2_one_gpu,dflash_block4,ddtree_nograph,ddtree_bs4_load,refusals_ddtree,refusals_dflash,refusals_base ddtree_int4,dflash_int4,base_int4" ;;
  int4) waves="ddtree_int4,dflash_int4,base_int4" ;;
  # Capture-only, one engine at a time; the first builds the INT4 JIT kernels itself.
  int4-alone) waves="dflash_int4_alone base_int4_alone" ;;
  # The trained pair: all at once (the verify pairs serve first, then each speed run alone).
  # sglang 0.5.23's answers to the refusal set (DFLASH on the tiny Kimi-shaped model and on the
  # trained pair, no speculation on the tiny model).
  refusals523) waves="refusals523_dflash,refusals523_trained,refusals523_base" ;;
  trained) waves="trained_base,trained_dflash,trained_ddtree_b8,trained_ddtree_b16,trained_ddtree_b32,trained_wrong,trained_verify_dflash,trained_verify_ddtree" ;;
  *) waves="$*" ;;
esac
# The INT4 runs' Marlin kernels are JIT-built at first use: built once here, in the background
# while earlier waves run, instead of by each INT4 engine at its start ($OUT/jit_warm.log).
case "$phase" in round2|int4)
  if [ ! -f "$stash/jit.ok" ]; then
    ( PYTHONPATH="$stash/site:$stash/stubs:$stash/sglang-433c58ed70cd1dabe5a07a83da12f1513cd599ae/python" \
        python3 tests/gpu/realengine/jit_warm.py > "$out/jit_warm.log" 2>&1 && touch "$stash/jit.ok" ) &
    jit_pid=$!
  fi ;;
esac
for wave in $waves; do
  case "$wave" in *_int4*) [ -n "${jit_pid:-}" ] && wait "$jit_pid" && jit_pid= ;; esac
  todo=()
  for run in ${wave//,/ }; do
    if [ -f "$stash/runs/$run/run.json" ]; then echo "[$run] recorded earlier"; else todo+=("$run"); fi
  done
  [ ${#todo[@]} -eq 0 ] && continue
  names=$(IFS=,; echo "${todo[*]}")
  need=$(PYTHONPATH=. python3 tests/gpu/realengine/runs.py --wave-min "$names")
  left=$(( RIG_DEADLINE - $(date +%s) ))
  if [ "$left" -lt "$need" ]; then echo "[$names] skipped: $left s left, the wave needs $need"; continue; fi
  echo "[$names] wave of ${#todo[@]} ($left s left, needs about $need)"
  i=0 pids=()
  for run in "${todo[@]}"; do
    RIG_PORT=$(( 30000 + 10 * i )) RIG_SHARED_GPU=${#todo[@]} RIG_WAVE=$names \
      python3 tests/gpu/realengine/record.py "$run" "$stash/runs" &
    pids+=($!) i=$(( i + 1 ))
    sleep 2  # a little apart: each engine's first look at free memory
  done
  # Only the runs: a bare `wait` would wait for the log's tee too, which never ends.
  wait "${pids[@]}"
done
tar -cJf "$out/recordings-${phase//[^A-Za-z0-9_.-]/_}.tar.xz" -C "$stash/runs" . && ls -la "$out"
echo "rig $phase end after $((SECONDS - t0)) s"
