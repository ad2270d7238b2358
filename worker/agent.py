"""The engine agent's entry point: `python3 -m worker.agent` (the compose `agent` service).

One per GPU host; it owns the engine containers there from start to exit
(web/agent/controller.py). With APPLIANCE_PANEL_URL set it is a fleet host's agent
instead (appliance/runtime/remote_agent.py): the panel's API only, Django never loaded,
no database or broker address (docs/fleet.md). SIGTERM ends it cleanly: leases are
released so a successor takes over at once; engines keep running.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

if os.environ.get("APPLIANCE_PANEL_URL"):
    from appliance.runtime.remote_agent import remote_agent_run_forever
else:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    django.setup()
    from web.agent.controller import agent_run_forever


def main() -> None:
    logging.basicConfig(level=os.environ.get("APPLIANCE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if os.environ.get("APPLIANCE_PANEL_URL"):
        sys.exit(remote_agent_run_forever(stop))
    agent_run_forever(stop)


if __name__ == "__main__":
    main()
