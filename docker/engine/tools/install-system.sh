#!/bin/bash
# Makes sure the base has python3 with its headers, venv, git, patch and a C compiler (the CUDA
# base has none of them: Triton and FlashInfer compile kernels at run time and need cc and
# Python.h), then creates the venv everything is installed into.
set -euo pipefail
need=()
command -v python3 >/dev/null || need+=(python3 python3-venv python3-pip)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
py_include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
[ -n "$py_include" ] && [ -f "$py_include/Python.h" ] || need+=(python3-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v c++ >/dev/null || need+=(g++)
command -v git >/dev/null || need+=(git)
command -v patch >/dev/null || need+=(patch)
if [ "${#need[@]}" -gt 0 ]; then
  apt_opts=()
  if [ -n "${APPLIANCE_APT_CA:-}" ]; then apt_opts+=(-o "Acquire::https::CAInfo=$APPLIANCE_APT_CA"); fi
  apt-get "${apt_opts[@]}" update
  apt-get "${apt_opts[@]}" install -y --no-install-recommends ca-certificates "${need[@]}"
  rm -rf /var/lib/apt/lists/*
fi
# System site packages: setuptools and wheel from the distribution work offline.
python3 -m venv --system-site-packages /opt/venv
