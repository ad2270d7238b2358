"""The batch limit and the prefix cache: what makes the stand-in pacable for a fleet bench.

- Batch limit: at most `--max-running-requests` requests decode at once (as SGLang's
  scheduler admits them); the rest wait in the queue (`#queue-req`, `sglang:num_queue_reqs`)
  until one finishes. Without the flag nothing waits, as before (the stand-in prints its
  default of 256, or 48 speculative, in `server_args` but does not hold it).
- Prefix cache: a prompt's tokens (its words; a chat's messages as JSON) are kept in an LRU
  of chained prefix hashes, as SGLang's radix cache keeps token prefixes; a later prompt that
  starts the same way has that many `cached_tokens`, never its whole length (SGLang computes
  at least one token: the recordings' `#new-token: 1, #cached-token: 50`).
  `--disable-radix-cache` turns it off. Each uncached prompt token costs
  TEST_ENGINE_PREFILL_TOKEN_S of prefill (0 by default), so a hit is also a shorter wait.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sglang.test_engine.engine import STATE
from sglang.test_engine.settings import CACHE_TOKENS, PREFILL_TOKEN_S


@dataclass
class Ticket:
    """One request's prompt as the scheduler sees it; `cached` is set when it is admitted."""

    words: list[str]
    cached: int = 0

    @property
    def prompt_tokens(self) -> int:
        return max(1, len(self.words))


class PrefixCache:
    """Chained hashes of every prompt prefix, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 0)
        self.entries: OrderedDict[int, None] = OrderedDict()
        self.lock = threading.Lock()

    def match_and_insert(self, words: list[str]) -> int:
        """The longest cached prefix of `words` (at most all but one), then `words` cached."""
        if not self.capacity or not words:
            return 0
        matched, h, keys = 0, 0, []
        with self.lock:
            for word in words:
                h = hash((h, word))
                keys.append(h)
                if matched == len(keys) - 1 and h in self.entries:
                    matched += 1
            for key in keys:
                self.entries[key] = None
                self.entries.move_to_end(key)
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return min(matched, len(words) - 1)


class Slots:
    """At most `limit` requests running; 0: no limit."""

    def __init__(self) -> None:
        self.limit = 0
        self.cond = threading.Condition()
        self.busy = 0

    def acquire(self) -> None:
        with self.cond:
            if self.limit and self.busy >= self.limit:
                with STATE.lock:
                    STATE.queued += 1
                try:
                    self.cond.wait_for(lambda: self.busy < self.limit)
                finally:
                    with STATE.lock:
                        STATE.queued -= 1
            self.busy += 1

    def release(self) -> None:
        with self.cond:
            self.busy -= 1
            self.cond.notify()


CACHE = PrefixCache(CACHE_TOKENS)
SLOTS = Slots()


def configure(*, max_running: int, radix_cache: bool) -> None:
    """Set by launch_server.main() from the launch flags."""
    SLOTS.limit = max(max_running, 0)
    if not radix_cache:
        CACHE.capacity = 0


def admit(ticket: Ticket) -> None:
    """Wait for a running slot, look the prompt up in the prefix cache, prefill the rest."""
    SLOTS.acquire()
    ticket.cached = CACHE.match_and_insert(ticket.words)
    if PREFILL_TOKEN_S > 0:
        time.sleep(PREFILL_TOKEN_S * (ticket.prompt_tokens - ticket.cached))


def leave() -> None:
    SLOTS.release()
