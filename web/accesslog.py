"""What the access log leaves out: the hosts' own API calls that succeeded.

Each joined host calls /api/fleet/host/ several times a second (its placements, heartbeat,
events, metrics: appliance/runtime/remote_agent.py), which made 99.8% of an idle trial's
access log (5,389 of 5,400 lines a minute) and hid everything else. Those lines are
dropped when the answer is below 400; a refused or failed one is kept, as is every other
path. APPLIANCE_ACCESS_LOG_HOST_API=1 keeps them all (debugging a host's link).
"""

from __future__ import annotations

import logging
import os

HOST_API = "/api/fleet/host/"


class QuietHostAPI(logging.Filter):
    """uvicorn's access record: args are (client, method, path, http version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        path, status = args[2], args[4]
        if not isinstance(path, str) or not path.startswith(HOST_API):
            return True
        return not (isinstance(status, int) and status < 400)


def quiet_access_log() -> None:
    """Install the filter on uvicorn's access logger, once (this process's)."""
    if os.environ.get("APPLIANCE_ACCESS_LOG_HOST_API", "") in ("1", "true", "yes"):
        return
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietHostAPI) for f in logger.filters):
        logger.addFilter(QuietHostAPI())
