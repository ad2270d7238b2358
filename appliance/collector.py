"""The cyclic garbage collector's settings for the long-running processes of the log path:
the panel (web/asgi.py) and the engine agent (worker/agent.py).

Both handle a busy engine's lines in batches of thousands of events, each an object or
three the collector tracks. At CPython's default (a young pass every 700 new objects) a
batch still in flight was passed over dozens of times, promoted, and each promotion
brought a full pass over every object of the process nearer: at 10,000 decode lines/s the
agent spent 15 µs of a line in the collector, most in full passes of 160 ms each
(`bench/log_path.py --phases sustained`; docs/performance.md, Log path). A young pass every
YOUNG_OBJECTS leaves most of a batch's objects freed by their reference counts before a
pass sees them; a pass over 50,000 objects takes a few milliseconds.

What was made before `settle()` (modules, settings, URL patterns, templates) lives as long
as the process: frozen, the full passes never walk it again.
"""

from __future__ import annotations

import gc

YOUNG_OBJECTS = 50_000  # new tracked objects between two young passes (CPython: 700)
MIDDLE_PASSES = 10  # young passes between two middle ones (CPython's own)
FULL_PASSES = 10  # middle passes between two full ones, at the least (CPython's own)


def settle() -> None:
    """Freeze what the process made so far and space the young passes out; once, when the
    process is set up and before it serves."""
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, MIDDLE_PASSES, FULL_PASSES)
