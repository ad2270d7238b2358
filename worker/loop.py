"""The panel loop's entry point: `python3 -m worker.loop` (the compose `loop` service).

One process for the whole panel (web/loop.py): the rolling changes' steps, the re-queue of
builds no live worker holds, the Tune sweep, the retention prunes and, hourly, the own
host's join token in its file (APPLIANCE_OWN_HOST_TOKEN_FILE). A second copy waits
on the loop's database lock and acts once the first is gone. SIGTERM ends it cleanly: its
lock session ends, so a successor acts at its next tick.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import django

STATEMENT_TIMEOUT_S = 120  # the retention's chunks and a roll's row lock take far less

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
# Every statement of this process's database connections is bounded (libpq reads PGOPTIONS;
# the lock's own connection sets a shorter one): a duty waits on a row lock or a slow
# server at most this long, logs it and tries again the next tick.
os.environ.setdefault("PGOPTIONS", f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}")
django.setup()

from web.loop import panel_loop  # noqa: E402 - Django must be set up first


def main() -> None:
    logging.basicConfig(level=os.environ.get("APPLIANCE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    panel_loop(stop)


if __name__ == "__main__":
    main()
