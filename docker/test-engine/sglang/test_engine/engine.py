"""The engine's state: the launch Config, the counters and histograms SGLang reports."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sglang.test_engine.config import Config
from sglang.test_engine.logits import Planted
from sglang.test_engine.profile import Profile, Profiles
from sglang.test_engine.refusals import Refusals
from sglang.test_engine.settings import HIST_BUCKETS


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(HIST_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(HIST_BUCKETS):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class State:
    ready: bool = False
    # SGLang's uvicorn starts after the graphs are captured: no access line comes before.
    http_up: bool = False
    running: int = 0
    queued: int = 0
    decode_steps: int = 0
    tokens_in_use: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # SGLang's gauge: the hit rate of the last prefill batch (here: the last request's).
    cache_hit_rate: float = 0.0
    generation_tokens: int = 0
    num_requests: int = 0
    last_gen_throughput: float = 0.0
    accept_tokens: int = 0
    verify_steps: int = 0
    weight_load_s: float = 0.0
    first_request_seen: bool = False
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    lock: threading.Lock = field(default_factory=threading.Lock)

    ready_at: float = 0.0
    # SGLang reports acceptance over the steps since its last decode log line.
    window_tokens: int = 0
    window_steps: int = 0
    last_accept: float = 0.0

    @property
    def avg_accept(self) -> float:
        """Acceptance over the last decode-log window (the whole life before the first)."""
        if self.last_accept:
            return self.last_accept
        return self.accept_tokens / self.verify_steps if self.verify_steps else 0.0

    def close_window(self) -> None:
        if self.window_steps:
            self.last_accept = self.window_tokens / self.window_steps
        self.window_tokens = self.window_steps = 0


# PLANTED: TEST_ENGINE_DIVERGE's divergences, parsed once by launch_server.main().
PLANTED: tuple[Planted, ...] = ()
# PROFILES: the recordings the speculation and step costs play, and COLLAPSED the one
# accept-collapse falls to; set once by launch_server.main() (profile.py).
PROFILES: Profiles | None = None
COLLAPSED: Profile | None = None
# REFUSALS: what the imitated build (TEST_ENGINE_BUILD) refuses under the launch's algorithm
# (refusals.py); set once by launch_server.main(); None (replay mode): nothing refused here.
REFUSALS: Refusals | None = None
# CFG is set once, by launch_server.main(); it is rebound there, so read it as engine.CFG.
CFG: Config
STATE = State()
MAX_TOKENS_POOL = 1048576
