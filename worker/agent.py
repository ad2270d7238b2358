"""The engine agent's entry point: `python3 -m worker.agent` (the compose `agent` service).

One per GPU host; it owns the engine containers there from start to exit
(web/agent/controller.py). SIGTERM ends it cleanly: leases are released so a successor
takes over at once; engines keep running.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup()

from web.agent.controller import agent_run_forever  # noqa: E402


def main() -> None:
    logging.basicConfig(level=os.environ.get("APPLIANCE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent_run_forever(stop)


if __name__ == "__main__":
    main()
