#!/bin/bash
# A simulated GPU host's start (docker/sim-host/Dockerfile): its own Docker engine, the
# test engine image in it, a models folder the simulator serves, then the host's roles as
# docker/compose.host.yaml runs them (`appliance-panel agent`, with its environment),
# each restarted when it exits, as compose's `restart: unless-stopped` would.
#
#   sim-host [ROLE...]    roles of the panel image's entrypoint; default: agent (the host's
#                         worker joins when its jobs come over the panel's API, docs/fleet.md)
#   sim-host exec CMD...  the engine and models only, then CMD (tests, a shell)
#
#   APPLIANCE_ENGINE_IMAGE       the tag the engine is imported as (appliance-test-engine:latest)
#   APPLIANCE_JOIN_TOKEN_FILE    a file holding the join token: the agent waits for it (up
#                                to APPLIANCE_JOIN_TOKEN_WAIT_S, 120 s) and reads it, never
#                                printed nor put in an environment; APPLIANCE_JOIN_TOKEN works too
#   APPLIANCE_MODELS_DIR         the host's models folder (/models); the simulator's model
#                                folders are made in it when missing
#   APPLIANCE_HOST_ADVERTISE_ADDR  where the panel reaches this host's engines (default:
#                                this container's address on its network)
#   SIM_HOST_DOCKERD_ARGS        extra dockerd arguments
#
# A role's process id is in /run/sim-host/ROLE.pid: the fleet's tests kill the agent by it.
set -euo pipefail

state=/run/sim-host
mkdir -p "$state"
log() { printf 'sim-host: %s\n' "$*" >&2; }

start_dockerd() {
  # A stale pid file from before a `docker restart` of this container stops dockerd.
  rm -f /var/run/docker.pid /run/docker/containerd/containerd.pid
  # shellcheck disable=SC2086 (the extra arguments are words)
  dockerd --host unix:///var/run/docker.sock ${SIM_HOST_DOCKERD_ARGS:-} \
    >/var/log/dockerd.log 2>&1 &
  echo $! >"$state/dockerd.pid"
  local waited=0
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null || [ $waited -ge 600 ]; then
      log "dockerd did not start (does the container have every capability but SYS_RESOURCE, unconfined seccomp and AppArmor, and /sys/fs/cgroup read-write? docker/compose.trial.yaml); its log:"
      tail -30 /var/log/dockerd.log >&2
      exit 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  log "dockerd $(docker version -f '{{.Server.Version}}') ready in $((waited / 10)).$((waited % 10))s"
}

# The engine's root filesystem (the image's COPY of the test engine) as an image of this
# host's engine, once: a second start finds it in /var/lib/docker.
import_engine() {
  local image="${APPLIANCE_ENGINE_IMAGE:-appliance-test-engine:latest}" started=$SECONDS
  if docker image inspect "$image" >/dev/null 2>&1; then
    log "$image already here"
    return 0
  fi
  local changes=() line
  while IFS= read -r line; do
    case "$line" in '' | '#'*) continue ;; esac
    changes+=(--change "$line")
  done </opt/sim-host/engine-image.changes
  tar -C /opt/sim-host/engine-rootfs -c . | docker import "${changes[@]}" - "$image" >/dev/null
  log "imported $image (the simulator) in $((SECONDS - started))s"
}

make_models() {
  python3 -m appliance.simulator models "${APPLIANCE_MODELS_DIR:-/models}"
}

# run_role ROLE: the panel image's entrypoint for ROLE, again 2 s after it exits. `docker
# stop` reaches every process at once (tini -g: the whole process group gets the TERM), so
# the roles, the loops and dockerd (which stops its engines) all end together.
run_role() {
  local role="$1" rc
  while true; do
    /usr/local/bin/appliance-panel "$role" &
    # Written whole, then renamed: a reader never sees the file empty.
    echo $! >"$state/$role.pid.new" && mv -f "$state/$role.pid.new" "$state/$role.pid"
    rc=0
    wait $! || rc=$?
    log "$role exited ($rc); starting it again in 2 s"
    sleep 2
  done
}

start_dockerd
import_engine
make_models

if [ "${1:-}" = exec ]; then
  shift
  exec "$@"
fi
[ $# -gt 0 ] || set -- agent
# The credential the agent gets at its join, kept where compose.host.yaml keeps it (a volume
# in the trial, so a restarted host does not need its token again).
export APPLIANCE_HOST_CREDENTIAL_FILE="${APPLIANCE_HOST_CREDENTIAL_FILE:-/var/lib/appliance/host-credential/credential}"
mkdir -p "$(dirname "$APPLIANCE_HOST_CREDENTIAL_FILE")" /run/secrets/engine
export APPLIANCE_ENGINE_SECRETS_DIR="${APPLIANCE_ENGINE_SECRETS_DIR:-/run/secrets/engine}"
export APPLIANCE_MODELS_DIR="${APPLIANCE_MODELS_DIR:-/models}"
# The address the panel reaches this host's engines at: its own on its network, unless told.
if [ -z "${APPLIANCE_HOST_ADVERTISE_ADDR:-}" ]; then
  APPLIANCE_HOST_ADVERTISE_ADDR="$(hostname -i | awk '{print $1}')"
  export APPLIANCE_HOST_ADVERTISE_ADDR
fi
for role in "$@"; do
  run_role "$role" &
done
wait
