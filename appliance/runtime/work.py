"""One engine's thread in a host's agent (appliance/runtime/remote_agent.py): what it does
and how to end it."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class EngineWork:
    thread: threading.Thread
    stop: threading.Event
    token: str  # the start token of the run it follows or stops
    kind: str  # follow | stop
