#!/usr/bin/env bash
# Build the test engine image (a simulator of SGLang, used only by tests).
#
#   bash docker/test-engine/build.sh [TAG] [BASE_IMAGE]
#
# Its build context is docker/ (for engine/runtime/entrypoint.py) plus the real engine's
# recordings, tests/fixtures/real-engine, placed at test-engine/recordings/ so the image can
# replay them (TEST_ENGINE_REPLAY, docker/test-engine/README.md). The context is streamed as
# a tar, so nothing is copied into the checkout (builds of several test sessions at once
# cannot trip over each other) and the fixtures stay where the tests read them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-${APPLIANCE_TEST_ENGINE_IMAGE:-appliance-test-engine:latest}}
base=${2:-${APPLIANCE_BASE_IMAGE:-appliance-base:bookworm}}
tar -C "$repo" -c --exclude='__pycache__' --exclude='*.pyc' \
    --transform='s,^docker/,,;s,^tests/fixtures/real-engine,test-engine/recordings,' \
    docker tests/fixtures/real-engine \
  | docker build -q -t "$tag" --build-arg BASE_IMAGE="$base" -f test-engine/Dockerfile -
