#!/bin/bash
# Puts the SGLang source at /opt/sglang (git or context tarball) or installs the pip release.
set -euo pipefail
if [ -f /opt/appliance/src/sglang.tar ]; then
  mkdir -p /opt/sglang
  tar -x -f /opt/appliance/src/sglang.tar -C /opt/sglang
  rm -f /opt/appliance/src/sglang.tar
  echo "appliance: SGLang source from the build context ($(cat /opt/appliance/src/sglang.ref 2>/dev/null || echo unknown ref))"
elif [ -n "$SGLANG_GIT" ]; then
  git clone --filter=blob:none --no-checkout "$SGLANG_GIT" /opt/sglang
  git -C /opt/sglang checkout --detach "${SGLANG_REF:-HEAD}"
  echo "appliance: SGLang source $SGLANG_GIT at $(git -C /opt/sglang rev-parse HEAD)"
elif [ -n "$SGLANG_PIP" ]; then
  pip install "sglang==$SGLANG_PIP"
else
  echo "appliance: the recipe names no SGLang source (pip, git or a local repository)" >&2
  exit 1
fi
