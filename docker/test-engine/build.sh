#!/usr/bin/env bash
# Build the test engine image (a simulator of SGLang, used only by tests).
#
#   bash docker/test-engine/build.sh [TAG] [BASE_IMAGE]
#
# BASE_IMAGE defaults to the local base (APPLIANCE_BASE_IMAGE, appliance-base:bookworm, made by
# docker/base/make-base-image.sh without a registry); any Debian-based image with python3 works.
#
# Its build context is docker/ (for engine/runtime/entrypoint.py) plus the real engine's
# recordings, tests/fixtures/real-engine, placed at test-engine/recordings/ so the image can
# replay them (TEST_ENGINE_REPLAY, docker/test-engine/README.md). The context is streamed as
# a tar, so nothing is copied into the checkout (builds of several test sessions at once
# cannot trip over each other) and the fixtures stay where the tests read them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-${APPLIANCE_TEST_ENGINE_IMAGE:-appliance-test-engine:latest}}
local_base=${APPLIANCE_BASE_IMAGE:-appliance-base:bookworm}
base=${2:-$local_base}
have() { docker image inspect "$1" >/dev/null 2>&1; }
# A base named here but not on this Docker engine is pulled; without a registry that fails,
# so the local base (docker/base/make-base-image.sh) is used instead, and said so.
if ! have "$base"; then
  if [ "$base" != "$local_base" ] && ! docker pull -q "$base" >/dev/null 2>&1; then
    if have "$local_base"; then
      echo "build.sh: $base is not on this Docker engine and cannot be pulled (no registry?);" \
           "using the local base image $local_base instead" >&2
      base=$local_base
    else
      echo "build.sh: $base is not on this Docker engine and cannot be pulled (no registry?)," \
           "and there is no local base image $local_base: make it with" \
           "\`bash docker/base/make-base-image.sh\`, then run this again" >&2
      exit 1
    fi
  elif ! have "$base"; then
    echo "build.sh: no base image $base: make it with \`bash docker/base/make-base-image.sh\`" \
         "(no registry needed), or name a base image that is here: build.sh TAG BASE_IMAGE" >&2
    exit 1
  fi
fi
tar -C "$repo" -c --exclude='__pycache__' --exclude='*.pyc' \
    --transform='s,^docker/,,;s,^tests/fixtures/real-engine,test-engine/recordings,' \
    docker tests/fixtures/real-engine \
  | docker build -q -t "$tag" --build-arg BASE_IMAGE="$base" -f test-engine/Dockerfile -
