#!/usr/bin/env bash
# Kept under its old name for its callers; make-local-images.sh does the work.
#
#   make-base-image.sh        every local image (base, python, redis, postgres), as
#                             tests/setup-and-run.sh wants before pytest; prints .env lines
#   make-base-image.sh TAG    only the Debian base image with Python 3, tagged TAG (what this
#                             script always did; tests/conftest_docker.py calls it so)
#
# Each image is made only when its tag is missing (debootstrap + `docker import`, no registry).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -gt 0 ]; then
  APPLIANCE_BASE_IMAGE="$1" exec bash "$here/make-local-images.sh" base
fi
exec bash "$here/make-local-images.sh"
