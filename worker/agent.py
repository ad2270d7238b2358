"""The engine agent's entry point: `python3 -m worker.agent` (the compose `agent` service).

One per GPU host, the panel's own included: the fleet's agent program
(appliance/runtime/remote_agent.py), which owns the host's engine containers from start
to exit and talks to the panel through its host API only: Django never loaded, no
database or broker address (docs/fleet.md). APPLIANCE_PANEL_URL names the panel. SIGTERM
ends it cleanly: its hold on the host is given back so a successor takes over at once;
engines keep running.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from appliance import collector
from appliance.runtime.remote_agent import remote_agent_run_forever


def main() -> None:
    logging.basicConfig(level=os.environ.get("APPLIANCE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not os.environ.get("APPLIANCE_PANEL_URL"):
        sys.exit("set APPLIANCE_PANEL_URL: the engine agent talks to the panel through its "
                 "host API (compose.yaml gives the panel's own host http://web:8000; a "
                 "joined host the panel's address, docs/fleet.md)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    collector.settle()  # the log path's batches (appliance/collector.py)
    sys.exit(remote_agent_run_forever(stop))


if __name__ == "__main__":
    main()
