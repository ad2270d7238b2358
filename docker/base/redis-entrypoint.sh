#!/bin/sh
# Entrypoint of the local Redis image (make-local-images.sh): behaves like the official
# redis:7-alpine image at the container boundary, for machines that cannot pull it.
#
# The official image builds Redis with protected mode off and no bind restriction, so a
# container listens for other containers without any config. Debian's redis-server keeps
# the upstream defaults (protected mode on: only loopback clients may talk to it without a
# password), so when no config file is given we prepend the options that make it the same.
# Options given by the caller come after ours, and Redis lets the last one win.
set -eu

# `docker run IMAGE --appendonly yes` or `docker run IMAGE /path/redis.conf`, as upstream.
case "${1:-}" in
  -* | *.conf) set -- redis-server "$@" ;;
esac

if [ "${1:-}" = redis-server ]; then
  shift
  case "${1:-}" in
    "" | -*)  # no config file: listen on every address, protected mode off
      set -- redis-server --bind '*' '-::*' --protected-mode no "$@" ;;
    *)  # a config file decides for itself (with Debian's defaults, not the official
        # image's, for what it leaves out: say `protected-mode no` and `bind` in it)
      set -- redis-server "$@" ;;
  esac
  if [ "$(id -u)" = 0 ]; then
    # Data in the working directory (/data) belongs to redis, whatever made the volume;
    # then drop root. setpriv execs (no fork), so redis-server stays PID 1 and gets
    # `docker stop`'s SIGTERM itself, then saves and exits cleanly.
    find . \! -user redis -exec chown redis:redis '{}' +
    umask 0077
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi

exec "$@"
