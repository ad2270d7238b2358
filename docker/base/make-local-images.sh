#!/usr/bin/env bash
# Makes the local images that compose.yaml needs on a machine without a container
# registry (where `docker pull` fails), and prints the variables that point compose.yaml
# at them, in .env format:
#
#   bash docker/base/make-local-images.sh >> .env     # every image below
#   bash docker/base/make-local-images.sh redis       # only some: base python redis postgres
#
#   name      tag (variable that overrides it)                     like
#   base      appliance-base:bookworm     (APPLIANCE_BASE_IMAGE)    python3, pip, venv, git,
#                                                                   patch, curl, ca-certificates
#   python    appliance-python:bookworm   (APPLIANCE_PYTHON_IMAGE)  python:3.x-slim (the base
#             image plus `python` and PIP_BREAK_SYSTEM_PACKAGES=1)
#   redis     appliance-redis:bookworm    (APPLIANCE_REDIS_IMAGE)   redis:7-alpine
#   postgres  appliance-postgres:bookworm (APPLIANCE_POSTGRES_IMAGE) postgres:16-alpine
#                                                                   (PostgreSQL 15: bookworm's)
#
# Each image is made only when its tag is missing, so a second run takes a second; remove
# a tag (`docker rmi`) to make it again. Images come from debootstrap (Debian bookworm from
# the host's deb mirror, DEBIAN_MIRROR) and `docker import`: no registry, and no container
# that needs the network. Redis and PostgreSQL share one debootstrap (one rootfs, imported
# twice with a different entrypoint), which saves a minute over two.
# Progress goes to stderr; stdout carries only the .env lines. Needs root (debootstrap).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base_tag="${APPLIANCE_BASE_IMAGE:-appliance-base:bookworm}"
python_tag="${APPLIANCE_PYTHON_IMAGE:-appliance-python:bookworm}"
redis_tag="${APPLIANCE_REDIS_IMAGE:-appliance-redis:bookworm}"
postgres_tag="${APPLIANCE_POSTGRES_IMAGE:-appliance-postgres:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
std_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '%s\n' "$*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
  exit "$1"
}

wanted=()
for arg in "$@"; do
  case "$arg" in
    base | python | redis | postgres) wanted+=("$arg") ;;
    -h | --help) usage 0 ;;
    *) log "unknown image: $arg"; usage 2 ;;
  esac
done
[ ${#wanted[@]} -gt 0 ] || wanted=(base python redis postgres)
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }
# The python image is the base image with two changes, so it needs the base.
if wants python; then wants base || wanted+=(base); fi

tag_of() {
  case "$1" in
    base) echo "$base_tag" ;; python) echo "$python_tag" ;;
    redis) echo "$redis_tag" ;; postgres) echo "$postgres_tag" ;;
  esac
}

# .env lines for the images compose.yaml names (the base image is for tests and builds).
print_env() {
  if ! wants python && ! wants redis && ! wants postgres; then return 0; fi
  echo "# local images for compose.yaml, made by docker/base/make-local-images.sh"
  if wants python; then echo "APPLIANCE_PYTHON_IMAGE=$python_tag"; fi
  if wants redis; then echo "APPLIANCE_REDIS_IMAGE=$redis_tag"; fi
  if wants postgres; then echo "APPLIANCE_POSTGRES_IMAGE=$postgres_tag"; fi
}

missing() {
  local name
  for name in "${wanted[@]}"; do have "$(tag_of "$name")" || echo "$name"; done
}

if [ -z "$(missing)" ]; then
  for name in "${wanted[@]}"; do log "$(tag_of "$name") already present"; done
  print_env
  exit 0
fi

# Concurrent callers (the test script, pytest fixtures) wait for each other here instead of
# debootstrapping the same rootfs twice; whoever comes second then finds the tags made.
exec 9>"${TMPDIR:-/tmp}/appliance-local-images.lock"
flock 9

work="$(mktemp -d "${TMPDIR:-/tmp}/appliance-images.XXXXXX")"
helper="appliance-make-images-$$"
cleanup() {
  docker rm -f "$helper" >/dev/null 2>&1 || true
  # debootstrap unmounts /proc and /sys from the rootfs when it stops, even on failure;
  # should one be left, never delete through it.
  if grep -q " $work/" /proc/mounts; then
    log "left $work: something is still mounted in it"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# debootstrap_into DIR PACKAGES: a minimal bookworm rootfs with PACKAGES (comma-separated).
# debootstrap fakes start-stop-daemon while it installs, so no service starts in the chroot.
debootstrap_into() {
  local dir="$1" packages="$2" started=$SECONDS
  log "debootstrap $suite + $packages from $mirror ..."
  debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # Downloaded .debs and package lists are only dead weight in an image.
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  log "  rootfs ready in $((SECONDS - started))s"
}

# import_rootfs DIR TAG [--change ...]: the whole rootfs as one image layer.
import_rootfs() {
  local dir="$1" tag="$2"
  shift 2
  tar -C "$dir" -c . | docker import "$@" - "$tag" >/dev/null
  log "made $tag"
}

make_base() {
  debootstrap_into "$work/base" python3,python3-venv,python3-pip,ca-certificates,git,patch,curl
  import_rootfs "$work/base" "$base_tag" \
    --change "ENV PATH=$std_path" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]'
  rm -rf "$work/base"
}

# What a Dockerfile written for python:3.x-slim expects of its base: `python` as well as
# `python3`, and `pip install` into the system Python (Debian marks it externally managed,
# PEP 668, so pip refuses without PIP_BREAK_SYSTEM_PACKAGES). One container with no network
# adds the link; `docker commit` adds the rest.
make_python() {
  docker run --name "$helper" --network none "$base_tag" \
    ln -sf /usr/bin/python3 /usr/local/bin/python >/dev/null
  docker commit \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'CMD ["python3"]' \
    "$helper" "$python_tag" >/dev/null
  docker rm "$helper" >/dev/null
  log "made $python_tag (from $base_tag)"
}

# One rootfs with redis-server and PostgreSQL and both entrypoints; each image gets its own.
make_services() {
  local dir="$work/services" pg_major
  debootstrap_into "$dir" redis-server,postgresql-15
  dpkg-query --admindir="$dir/var/lib/dpkg" -W -f '  ${Package} ${Version}\n' \
    redis-server postgresql-15 >&2
  pg_major="$(ls "$dir/usr/lib/postgresql")"
  # Manuals and message translations are dead weight in a server image (about 70 MB).
  rm -rf "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
    "$dir"/usr/share/locale/*
  install -m 0755 "$here/redis-entrypoint.sh" "$dir/usr/local/bin/redis-entrypoint"
  install -m 0755 "$here/postgres-entrypoint.sh" "$dir/usr/local/bin/postgres-entrypoint"
  # Debian's postinst made a cluster "main" for its own service manager; the entrypoint
  # makes one in PGDATA on first start instead, like the official image.
  rm -rf "$dir/etc/postgresql/$pg_major" "$dir/var/lib/postgresql/$pg_major"
  # Listen on every address (the official image edits the same sample); initdb copies it.
  sed -ri "s/^#?(listen_addresses)\s*=\s*\S+.*/\1 = '*'/" \
    "$dir/usr/share/postgresql/$pg_major/postgresql.conf.sample"
  grep -q "^listen_addresses = '\*'" "$dir/usr/share/postgresql/$pg_major/postgresql.conf.sample"
  # The data directories, owned by the users the entrypoints drop to (uids of this rootfs).
  local redis_ids postgres_ids
  redis_ids="$(awk -F: '$1 == "redis" { print $3 ":" $4 }' "$dir/etc/passwd")"
  postgres_ids="$(awk -F: '$1 == "postgres" { print $3 ":" $4 }' "$dir/etc/passwd")"
  install -d -m 0755 -o "${redis_ids%:*}" -g "${redis_ids#*:}" "$dir/data"
  install -d -m 0700 -o "${postgres_ids%:*}" -g "${postgres_ids#*:}" "$dir/var/lib/postgresql/data"
  install -d -m 3777 -o "${postgres_ids%:*}" -g "${postgres_ids#*:}" "$dir/var/run/postgresql"
  install -d -m 0755 "$dir/docker-entrypoint-initdb.d"

  if ! have "$redis_tag"; then
    import_rootfs "$dir" "$redis_tag" \
      --change "ENV PATH=$std_path" \
      --change 'ENV LANG=C.UTF-8' \
      --change 'VOLUME /data' \
      --change 'WORKDIR /data' \
      --change 'EXPOSE 6379' \
      --change 'ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]' \
      --change 'CMD ["redis-server"]'
  fi
  if ! have "$postgres_tag"; then
    import_rootfs "$dir" "$postgres_tag-import" \
      --change "ENV PATH=/usr/lib/postgresql/$pg_major/bin:$std_path" \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PGDATA=/var/lib/postgresql/data' \
      --change 'VOLUME /var/lib/postgresql/data' \
      --change 'EXPOSE 5432' \
      --change 'ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]' \
      --change 'CMD ["postgres"]'
    # `docker stop` sends SIGINT, PostgreSQL's fast shutdown, as in the official image
    # (SIGTERM is a smart shutdown: it waits for every client, e.g. the panel's pooled
    # connections, and docker kills it after 10s). `docker import --change` does not take
    # STOPSIGNAL before Docker 23, so a build FROM the local image adds it: no network.
    printf 'FROM %s\nSTOPSIGNAL SIGINT\n' "$postgres_tag-import" \
      | docker build -q -t "$postgres_tag" - >"$work/build.log" 2>&1 \
      || { cat "$work/build.log" >&2; exit 1; }
    docker rmi "$postgres_tag-import" >/dev/null
    log "made $postgres_tag"
  fi
  rm -rf "$dir"
}

started=$SECONDS
todo="$(missing)"  # again, under the lock: another caller may have made some meanwhile
if [[ "$todo" == *base* ]]; then make_base; fi
if [[ "$todo" == *python* ]]; then make_python; fi
if [[ "$todo" == *redis* || "$todo" == *postgres* ]]; then make_services; fi
for name in "${wanted[@]}"; do
  have "$(tag_of "$name")" || { log "error: $(tag_of "$name") was not made"; exit 1; }
done
log "local images ready in $((SECONDS - started))s"
print_env
