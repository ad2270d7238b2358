#!/bin/bash
# Installs the (patched) source tree, then the recipe's pip extras.
set -euo pipefail
if [ -d /opt/sglang ]; then
  pkg="/opt/sglang/${SGLANG_SUBDIR}"
  if [ "$SGLANG_INSTALL_DEPS" = "1" ]; then
    pip install -e "$pkg"
  else
    # Offline: no build, no resolution; the tree is importable as it is.
    site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$pkg" > "$site/appliance-sglang.pth"
    echo "appliance: $pkg on sys.path (no dependency install)"
  fi
fi
if [ -n "$PIP_EXTRAS" ]; then
  # Word splitting on purpose: PIP_EXTRAS is a space-separated list of requirement specs.
  # shellcheck disable=SC2086
  pip install $PIP_EXTRAS
fi
