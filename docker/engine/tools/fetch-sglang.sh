#!/bin/bash
# Puts the SGLang source at /opt/sglang (git or context tarball) or installs the pip release
# (from the recipe's lock when it has one, so patches can then be applied to site-packages).
set -euo pipefail
lock=/opt/appliance/lock/requirements.txt
if [ -f /opt/appliance/src/sglang.tar ]; then
  mkdir -p /opt/sglang
  tar -x -f /opt/appliance/src/sglang.tar -C /opt/sglang
  rm -f /opt/appliance/src/sglang.tar
  echo "appliance: SGLang source from the build context ($(cat /opt/appliance/src/sglang.ref 2>/dev/null || echo unknown ref))"
elif [ -n "$SGLANG_GIT" ]; then
  # Fetch the ref itself (commit, branch or tag): a PR head commit is not on any branch
  # a plain clone brings, but GitHub serves any reachable commit by id.
  git init -q /opt/sglang
  git -C /opt/sglang remote add origin "$SGLANG_GIT"
  git -C /opt/sglang fetch --depth 1 origin "${SGLANG_REF:-HEAD}"
  git -C /opt/sglang checkout -q --detach FETCH_HEAD
  echo "appliance: SGLang source $SGLANG_GIT at $(git -C /opt/sglang rev-parse HEAD)"
elif [ -n "$SGLANG_PIP" ]; then
  if [ -s "$lock" ]; then
    echo "appliance: installing sglang==$SGLANG_PIP and its dependencies from the recipe's lock"
    pip install --require-hashes --no-deps -r "$lock"
  else
    pip install --report /opt/appliance/lock/pip-report-sglang.json "sglang==$SGLANG_PIP"
  fi
else
  echo "appliance: the recipe names no SGLang source (pip, git or a local repository)" >&2
  exit 1
fi
