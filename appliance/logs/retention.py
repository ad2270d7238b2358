"""Which engine log lines an operator may need for a diagnosis, long after the run: the
retention of the event log (docs/events-retention.md) keeps these and lets the rest age out.

Kept: every line of a Python traceback (from its `Traceback` line through the exception line
and a few continuation lines), lines the parser turns into a phase or progress event (weights,
KV cache, CUDA-graph capture, ready, the self-check), lines a known cause matches, and lines
that say error, warning, exception, failure and the like. Not kept by this rule: decode and
prefill stats lines (their figures live in the metric series) and ordinary chatter.

Feed the lines in order; a keeper carries a traceback across calls.
"""

from __future__ import annotations

import re

from appliance.events import STATS_KINDS
from appliance.logs import matchers
from appliance.logs.lines import (
    CHAIN_MARKERS,
    MAX_CONTINUATION_LINES,
    TRACEBACK_START,
    classify,
    split_prefix,
)

# Portable as it stands to PostgreSQL's and SQLite's REGEXP (the retention's SQL uses it too).
NOTABLE_PATTERN = (
    r"error|exception|traceback|warn|fatal|critical|fail|killed|abort|panic|"
    r"out of memory|timed? ?out|refused|denied|segmentation|core dumped|nccl|assert")
_NOTABLE = re.compile(NOTABLE_PATTERN, re.IGNORECASE)


def is_stats_line(text: str) -> bool:
    """A decode or prefill stats line (its figures are folded into the metric series)."""
    message, _ = split_prefix(text)
    found = classify(message)
    return found is not None and found[0] in STATS_KINDS and not _NOTABLE.search(message)


class LineKeeper:
    """keep(text) for each line of one log, in order: True for a line to keep for good."""

    def __init__(self) -> None:
        self._in_traceback = False
        self._continuation: int | None = None  # lines after the exception line, once seen

    def keep(self, text: str) -> bool:
        message, _ = split_prefix(text)
        if TRACEBACK_START in message:
            self._in_traceback, self._continuation = True, None
            return True
        if self._in_traceback and self._traceback_goes_on(text, message):
            return True
        found = classify(message)
        if found is not None:
            return found[0] not in STATS_KINDS or bool(_NOTABLE.search(message))
        return bool(_NOTABLE.search(message)) or matchers.match_line(message) is not None

    def _traceback_goes_on(self, raw: str, message: str) -> bool:
        is_record = raw[:1] == "[" and raw[1:3].isdigit()  # another log record: it ended
        if is_record:
            self._in_traceback = False
            return False
        if self._continuation is None:
            stripped = message.strip()
            indented = message[:1] in (" ", "\t") or not stripped or stripped.startswith("^")
            if not indented and not stripped.startswith(CHAIN_MARKERS):
                self._continuation = 0  # the exception line
            return True
        if message.startswith(CHAIN_MARKERS):
            self._continuation = None  # a chained exception's traceback follows
            return True
        self._continuation += 1
        if self._continuation > MAX_CONTINUATION_LINES:
            self._in_traceback = False
            return False
        return True
