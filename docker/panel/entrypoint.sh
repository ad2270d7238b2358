#!/bin/sh
# One image, four roles (compose.yaml):
#   init    make the install's secrets once (secret key, database password) in the volume
#   web     refuse known secrets, migrate, create roles and the first admin once, serve ASGI
#   worker  the Celery worker: image builds (queue builds) and stops (queue control)
#   agent   the engine agent: owns this host's engine containers from start to exit
set -eu
case "${1:-web}" in
  init)
    exec python3 -m web.initsecrets "${APPLIANCE_SECRETS_DIR:-/var/lib/appliance/secrets}"
    ;;
  web)
    python3 -c "import django; django.setup(); from web.security import require_production_secrets as r; r()"
    python3 manage.py migrate --noinput
    python3 manage.py bootstrap
    # prometheus-client's multiprocess mode (web/deployments/prom.py): every web worker
    # writes its numbers here; emptied at each start, as the client's docs ask.
    export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-/tmp/appliance-prometheus}"
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR" && rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
    exec uvicorn web.asgi:application --host 0.0.0.0 --port 8000 --proxy-headers
    ;;
  worker)
    # control: stops; builds: image builds; bench: benchmark runs; models: model downloads
    # (worker/celery.py).
    exec celery -A worker.celery worker --loglevel INFO -Q control,builds,bench,models \
      --concurrency "${APPLIANCE_WORKER_CONCURRENCY:-4}"
    ;;
  agent)
    exec python3 -m worker.agent
    ;;
  *)
    exec "$@"
    ;;
esac
