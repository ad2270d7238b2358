#!/usr/bin/env bash
# Makes a local Debian base image with Python 3, without any container registry:
# debootstrap a rootfs and `docker import` it. Used for the test engine image and,
# where no registry is reachable, for the panel image too.
set -euo pipefail
tag="${1:-${APPLIANCE_BASE_IMAGE:-appliance-base:bookworm}}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag already present"
  exit 0
fi
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d /tmp/appliance-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,git,patch,curl \
  bookworm "$root" "$mirror" >/tmp/debootstrap.log 2>&1 || { tail -20 /tmp/debootstrap.log; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$tag"
echo "made base image $tag"
