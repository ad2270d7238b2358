#!/bin/sh
# web: migrate, create roles and the first admin once, serve ASGI on :8000.
# worker: the Celery worker with the supervisor beat embedded.
set -eu
case "${1:-web}" in
  web)
    python3 manage.py migrate --noinput
    python3 manage.py bootstrap
    exec uvicorn web.asgi:application --host 0.0.0.0 --port 8000 --proxy-headers
    ;;
  worker)
    exec celery -A worker.celery worker -B --loglevel INFO --concurrency "${APPLIANCE_WORKER_CONCURRENCY:-4}" \
      --schedule /tmp/celerybeat-schedule
    ;;
  *)
    exec "$@"
    ;;
esac
