#!/usr/bin/env bash
set -euo pipefail
root="$(pwd)"
log_dir="$root/var/test-services"
mkdir -p "$log_dir"

step() { printf '\n== %s\n' "$*"; }

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
command -v redis-server >/dev/null || need_apt+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v chromium >/dev/null || need_apt+=(chromium)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "installing Debian packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >"$log_dir/apt.log" 2>&1 \
    || { tail -30 "$log_dir/apt.log"; exit 1; }
fi

if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import appliance, django, rest_framework, celery, playwright, pytest" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  step "installing Python packages into .venv"
  .venv/bin/pip install -q -e ".[test]"
  touch .venv/.installed
fi

if ! docker info >/dev/null 2>&1; then
  step "starting dockerd"
  # live-restore: engines keep running while dockerd restarts (tests/worker/test_faults.py).
  (setsid dockerd --live-restore >"$log_dir/dockerd.log" 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -30 "$log_dir/dockerd.log"; exit 1; }
fi

export APPLIANCE_REDIS_URL="${APPLIANCE_REDIS_URL:-redis://127.0.0.1:6390/0}"
if ! redis-cli -p 6390 ping >/dev/null 2>&1; then
  step "starting redis-server on 127.0.0.1:6390"
  redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --logfile "$log_dir/redis.log"
  for _ in $(seq 30); do redis-cli -p 6390 ping >/dev/null 2>&1 && break; sleep 0.2; done
fi

pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
pg_data="/var/lib/appliance-test/pgdata"
pg_log="/var/lib/appliance-test/postgres.log"
if ! "$pg_bin/pg_isready" -h 127.0.0.1 -p 5440 >/dev/null 2>&1; then
  step "starting PostgreSQL on 127.0.0.1:5440"
  if [ ! -f "$pg_data/PG_VERSION" ]; then
    mkdir -p "$pg_data"; chown -R postgres:postgres /var/lib/appliance-test
    su postgres -c "$pg_bin/initdb -D '$pg_data' -A trust -U appliance" >"$log_dir/initdb.log"
  fi
  chown -R postgres:postgres /var/lib/appliance-test
  su postgres -c "$pg_bin/pg_ctl -D '$pg_data' -l '$pg_log' -w \
    -o '-p 5440 -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off' start" >/dev/null
fi
export APPLIANCE_DATABASE_URL="${APPLIANCE_DATABASE_URL:-postgres://appliance@127.0.0.1:5440/appliance}"

step "building local images (base, python, redis, postgres, test engine)"
bash docker/base/make-base-image.sh
# The panel image's own build (the compose test) downloads wheels through this machine's
# TLS-intercepting proxy: its CA goes to the wheel stage only (docker/panel/Dockerfile).
if [ -s /etc/ssl/certs/ca-certificates.crt ] && [ ! -s docker/panel/ca/ca.pem ]; then
  cp /etc/ssl/certs/ca-certificates.crt docker/panel/ca/ca.pem
fi
# Its context is docker/ plus the real-engine recordings it replays (see the script).
bash docker/test-engine/build.sh >/dev/null

step "lint"
.venv/bin/ruff check .
.venv/bin/mypy appliance web worker

step "pytest"
export APPLIANCE_CHROMIUM="${APPLIANCE_CHROMIUM:-/usr/bin/chromium}"
# With no arguments the tests run side by side in 3 pytest-xdist workers (most of the suite's
# time is spent waiting on containers, browsers and servers, not computing), each on its own
# database and Redis db (Redis dbs N..N+2 from APPLIANCE_REDIS_URL's N); the groups that share
# Docker names or restart services are kept apart (tests/conftest.py), and the slowest tests
# are listed at the end; every test's time is kept in var/test-report.xml (JUnit).
# Arguments replace all of that: `./test -p no:xdist tests/api` runs one folder in one process.
if [ $# -eq 0 ]; then
  set -- -n "${APPLIANCE_TEST_WORKERS:-3}" --dist loadgroup --durations=30 \
    --junitxml=var/test-report.xml
fi
.venv/bin/pytest -p no:cacheprovider "$@"
