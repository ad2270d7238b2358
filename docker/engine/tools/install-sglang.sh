#!/bin/bash
# Installs the (patched) source tree, then the recipe's pip extras. With a lock, every
# package comes from it by exact version and hash, and the tree is installed without
# resolving; without one, pip resolves and its reports stay in /opt/appliance/lock/ for
# `appliance lock`. Either way `pip check` must pass.
set -euo pipefail
lock=/opt/appliance/lock/requirements.txt
reports=/opt/appliance/lock
# The Rust gRPC extension needs cargo and crates (not on build machines); sources whose
# setup.py knows this switch skip it.
export SGLANG_BUILD_RUST_EXTS="${SGLANG_BUILD_RUST_EXTS:-none}"
if [ -n "${SGLANG_SCM_VERSION:-}" ]; then
  export SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG="$SGLANG_SCM_VERSION"
  export SETUPTOOLS_SCM_PRETEND_VERSION="$SGLANG_SCM_VERSION"
fi
if [ -d /opt/sglang ]; then
  pkg="/opt/sglang/${SGLANG_SUBDIR}"
  if [ "$SGLANG_INSTALL_DEPS" != "1" ]; then
    # Offline: no build, no resolution; the tree is importable as it is.
    site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$pkg" > "$site/appliance-sglang.pth"
    echo "appliance: $pkg on sys.path (no dependency install)"
  elif [ -s "$lock" ]; then
    echo "appliance: installing dependencies from the recipe's lock ($(grep -c '^[A-Za-z]' "$lock") packages)"
    pip install --require-hashes --no-deps -r "$lock"
    pip install --no-deps --no-build-isolation -e "$pkg"
  else
    pip install --report "$reports/pip-report-build.json" \
      "setuptools>=61" "setuptools-rust>=1.10" "setuptools-scm>=8" wheel
    pip install --no-build-isolation --report "$reports/pip-report-sglang.json" -e "$pkg"
  fi
fi
if [ -n "$PIP_EXTRAS" ] && [ ! -s "$lock" ]; then
  # Word splitting on purpose: PIP_EXTRAS is a space-separated list of requirement specs.
  # shellcheck disable=SC2086
  pip install --report "$reports/pip-report-extras.json" $PIP_EXTRAS
fi
if [ "$SGLANG_INSTALL_DEPS" = "1" ] || [ -n "$SGLANG_PIP" ]; then
  pip check
fi
