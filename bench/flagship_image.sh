#!/usr/bin/env bash
# Builds the flagship engine image from the pinned SGLang snapshot on a local base (no
# registry, no GitHub), from its lock, and checks it as shipped: import sglang, the DDTree
# launch flags, pip check, a compiler and Python headers for run-time kernel builds, and the
# GPU self-check stopping a GPU-less start. Prints the figures. Needs a folder of SGLang
# source snapshots named by APPLIANCE_SGLANG_SRC_DIR (docs/engine-sources.md), Docker, and
# PyPI through the CA bundle.
# Usage: bench/flagship_image.sh [base image, default appliance-base:bookworm]
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-appliance-base:bookworm}"
src="${APPLIANCE_SGLANG_SRC_DIR:?set APPLIANCE_SGLANG_SRC_DIR to a folder of SGLang source snapshots}"
ref="$(sed -n 's/^ *ref: *\([0-9a-f]\{40\}\).*/\1/p' appliance/engine/recipes/kimi-k2.6-ddtree.yaml)"
ca="${APPLIANCE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
work="$(mktemp -d)"
cat >"$work/flagship-snapshot.yaml" <<YAML
# The shipped kimi-k2.6-ddtree recipe with its git source swapped for the same commit's archive.
name: kimi-k2.6-ddtree-snapshot
base_image: $base
sglang:
  archive: $src/sglang-$ref.tar.gz
  ref: $ref
patches: []
lock: $PWD/appliance/engine/locks/kimi-k2.6-ddtree.lock.txt
YAML
t0=$SECONDS
.venv/bin/python -m appliance build "$work/flagship-snapshot.yaml" --ca-bundle "$ca" --text | tail -3
tag="$(.venv/bin/python -m appliance build "$work/flagship-snapshot.yaml" --plan | python3 -c 'import json,sys; print(json.load(sys.stdin)["tag"])')"
echo "build: $((SECONDS - t0)) s, $(docker image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.1f GB", $1/1e9}')"
run() { docker run --rm --entrypoint "$1" "$tag" "${@:2}"; }
run python3 -c 'import sglang, torch; print("import sglang", sglang.__version__, "torch", torch.__version__)'
echo "DDTree flags in launch_server --help: $(run python3 -m sglang.launch_server --help 2>/dev/null | grep -o -- '--speculative-ddtree-[a-z-]*' | sort -u | wc -l)"
run pip check
run bash -c 'cc --version | head -1; python3 -c "import sysconfig, os; print(\"Python.h:\", os.path.exists(sysconfig.get_paths()[\"include\"] + \"/Python.h\"))"'
t1=$(date +%s.%N)
docker run --rm -e APPLIANCE_GPU_CHECK=1 -e 'APPLIANCE_GPU_CHECK_ARGS=["--gpus","0,1,2,3,4,5,6,7","--algorithm","DDTREE","--block-size","8","--budget","32"]' \
  "$tag" python3 -m sglang.launch_server --model-path /models/kimi-k2.6 >"$work/selfcheck.log" 2>&1 && rc=0 || rc=$?
echo "self-check without a GPU: rc=$rc in $(echo "$(date +%s.%N) - $t1" | bc) s; $(grep -c '"ok":false' "$work/selfcheck.log") failed checks"
