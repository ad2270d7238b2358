#!/usr/bin/env bash
# The SGLang sources' own DDTree tests, on a GPU host without the whole SGLang install:
# run_sglang_tests.py (from ../shared/tools) stubs the modules SGLang's files import but the
# host lacks; msgspec, orjson, pybase64 and pydantic must be real (carried as wheels).
# Usage: run-sglang-source-tests.sh <folder with sglang-<commit>.tar.gz and run_sglang_tests.py>
set -uo pipefail
src="$(cd "$1" && pwd)"; out="${OUT:-.}"; work="$(mktemp -d)"
for archive in "$src"/sglang-*.tar.gz; do
  tar -xzf "$archive" -C "$work"
done
for tree in "$work"/sglang-*; do
  commit="$(basename "$tree" | cut -c8-16)"
  for test in test/registered/spec/ddtree/test_ddtree_gpu_build.py \
              test/registered/unit/spec/test_ddtree_utils.py; do
    [ -f "$tree/$test" ] || { echo "$commit $test: not in this source"; continue; }
    log="$out/source-$commit-$(basename "$test" .py).log"
    (cd "$tree" && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 STUB_SKIP=torchcodec PYTHONPATH="$tree/python:${PYTHONPATH:-}" \
      python3 "$src/run_sglang_tests.py" -q -p no:cacheprovider "$test" >"$log" 2>&1)
    echo "$commit $test: rc=$? $(grep -E '[0-9]+ (passed|failed|error)' "$log" | tail -1)"
  done
done
