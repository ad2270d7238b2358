#!/bin/sh
# One image, its roles (compose.yaml):
#   init    make the install's secrets once (secret key, database password) in the volume
#   web     refuse known secrets, migrate, create roles and the first admin once, serve ASGI
#   serve   the ASGI server alone (what web ends with; bench/load_api.py runs it as it is)
#   gateway /v1 alone, one process (compose's gateway-a and gateway-b, behind the proxy)
#   worker  the Celery worker: image builds, benchmarks, model downloads (web/tasks.py)
#   agent   the engine agent: owns this host's engine containers from start to exit
#   loop    the panel loop: rolling changes' steps, dead builds' re-queue, the Tune sweep,
#           retention (one copy acts: a second waits on its database lock)
set -eu

# One server process per core (uvicorn's own supervisor restarts one that dies): a Python
# process serves on one core at a time. At most 4 by default: each process has its own
# database pool (APPLIANCE_DB_POOL_MAX_SIZE), and their sum stays under max_connections.
# serve [APP [UVICORN OPTIONS...]]: options after the app override these (last one wins).
serve() {
  app="${1:-web.asgi:application}"
  if [ "$#" -gt 0 ]; then shift; fi
  cores=$(nproc)
  workers="${APPLIANCE_WEB_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
  # prometheus-client's multiprocess mode (web/deployments/prom.py): every web worker
  # writes its numbers here; emptied at each start, as the client's docs ask.
  export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-/tmp/appliance-prometheus}"
  mkdir -p "$PROMETHEUS_MULTIPROC_DIR" && rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
  exec uvicorn "$app" --host 0.0.0.0 --port 8000 --proxy-headers --workers "$workers" "$@"
}

case "${1:-web}" in
  init)
    exec python3 -m web.initsecrets "${APPLIANCE_SECRETS_DIR:-/var/lib/appliance/secrets}"
    ;;
  web)
    python3 -c "import django; django.setup(); from web.security import require_production_secrets as r; r()"
    python3 manage.py migrate --noinput
    python3 manage.py bootstrap
    serve
    ;;
  serve)
    shift
    serve "$@"
    ;;
  gateway)
    # One process: on SIGTERM uvicorn closes its listening socket at once (a new connection
    # is refused, and the proxy retries it on the other instance), then waits for the
    # requests under way, streams included, up to APPLIANCE_GATEWAY_DRAIN_S. Under
    # --workers the supervisor's socket would stay open, and connections queued on it lost.
    # No migrations: web makes the schema; the gateway reads it.
    exec uvicorn web.gateway.asgi:application --host 0.0.0.0 --port 8000 --proxy-headers \
      --timeout-graceful-shutdown "${APPLIANCE_GATEWAY_DRAIN_S:-600}"
    ;;
  worker)
    # builds: image builds; bench: benchmark runs; models: model downloads (web/tasks.py).
    # No stop waits here: the engine agent carries out stops.
    exec celery -A worker.celery worker --loglevel INFO -Q builds,bench,models \
      --concurrency "${APPLIANCE_WORKER_CONCURRENCY:-4}"
    ;;
  agent)
    exec python3 -m worker.agent
    ;;
  loop)
    exec python3 -m worker.loop
    ;;
  *)
    exec "$@"
    ;;
esac
