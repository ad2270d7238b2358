#!/usr/bin/env bash
# Entrypoint of the local PostgreSQL image (make-local-images.sh): behaves like the
# official postgres:16-alpine image for what compose.yaml uses, on machines that cannot
# pull it. Debian bookworm ships PostgreSQL 15; its binaries are on PATH (image ENV).
#
#   POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE  the superuser's password (needed to
#                                  initialise, unless POSTGRES_HOST_AUTH_METHOD=trust)
#   POSTGRES_USER                  the superuser (default postgres)
#   POSTGRES_DB                    a database made on first start (default $POSTGRES_USER)
#   POSTGRES_INITDB_ARGS           extra initdb arguments
#   POSTGRES_HOST_AUTH_METHOD      auth for TCP clients (default scram-sha-256)
#   PGDATA                         the data directory (default /var/lib/postgresql/data)
#   /docker-entrypoint-initdb.d/   *.sh and *.sql run once, after the database is made
#
# An empty data directory is initialised on first start; one that holds a cluster is
# used as it is (passwords and databases are not touched again).
set -Eeuo pipefail

# `docker run IMAGE -c shared_buffers=256MB` means postgres with those options, as upstream.
if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi

# VAR or VAR_FILE (a secret mounted as a file), not both; read while still root so a
# file only root may read works too.
file_env() {
  local var="$1" file_var="${1}_FILE" default="${2:-}"
  if [ -n "${!var:-}" ] && [ -n "${!file_var:-}" ]; then
    echo >&2 "error: both $var and $file_var are set (but are exclusive)"
    exit 1
  fi
  local value="$default"
  if [ -n "${!var:-}" ]; then
    value="${!var}"
  elif [ -n "${!file_var:-}" ]; then
    value="$(< "${!file_var}")"
  fi
  export "$var"="$value"
  unset "$file_var"
}

export PGDATA="${PGDATA:-/var/lib/postgresql/data}"

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  file_env POSTGRES_PASSWORD
  # The data directory must belong to postgres with mode 0700 or the server refuses it;
  # a fresh named volume belongs to root. The socket directory is where pg_isready and
  # psql look by default (Debian's libpq).
  mkdir -p "$PGDATA" /var/run/postgresql
  chmod 0700 "$PGDATA"
  find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
  chown postgres:postgres /var/run/postgresql
  chmod 3777 /var/run/postgresql
  # Run this script again as postgres. setpriv execs (no fork), so the server started
  # below stays PID 1 and gets `docker stop`'s signal itself.
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [ "$1" = postgres ]; then
  file_env POSTGRES_PASSWORD
  file_env POSTGRES_USER postgres
  file_env POSTGRES_DB "$POSTGRES_USER"
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"

  if [ -s "$PGDATA/PG_VERSION" ]; then
    echo "PostgreSQL Database directory appears to contain a database; Skipping initialization"
  else
    if [ -z "$POSTGRES_PASSWORD" ] && [ "$auth" != trust ]; then
      cat >&2 <<'EOF'
Error: Database is uninitialized and superuser password is not specified.
       Set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE) to a non-empty value for the
       superuser, or POSTGRES_HOST_AUTH_METHOD=trust to allow all connections without
       a password (not recommended).
EOF
      exit 1
    fi
    # Local (socket) connections are trusted, as upstream; TCP needs the password.
    # The password goes through a pipe, never onto a command line.
    # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is a list of words, as upstream
    initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
      --auth-local=trust --auth-host="$auth" ${POSTGRES_INITDB_ARGS:-}
    printf '\nhost all all all %s\n' "$auth" >> "$PGDATA/pg_hba.conf"

    # A temporary server on the socket only, so no client can connect half-way.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
    psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
    if [ "$POSTGRES_DB" != postgres ]; then
      "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
    fi
    for f in /docker-entrypoint-initdb.d/*; do
      case "$f" in
        *.sh) echo "running $f"; . "$f" ;;
        *.sql) echo "running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
        *) if [ -e "$f" ]; then echo "ignoring $f"; fi ;;
      esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    echo "PostgreSQL init process complete; ready for start up."
  fi
  # The password was only needed for initdb; the server does not need it in its environment.
  unset POSTGRES_PASSWORD
fi

exec "$@"
