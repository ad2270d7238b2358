"""Generation: decode steps, the counters they keep, and the ddtree-width crash."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

from sglang.test_engine import batching
from sglang.test_engine.batching import Ticket
from sglang.test_engine.config import Config
from sglang.test_engine.engine import STATE
from sglang.test_engine.loglines import decode_line, prefill_line
from sglang.test_engine.settings import (
    ACCEPT_LEN,
    COLLAPSE_AFTER_S,
    COLLAPSED_ACCEPT_LEN,
    FAIL,
    HANG_AFTER_TOKENS,
    TOKEN_S,
    TRAFFIC,
)
from sglang.test_engine.tracebacks import ddtree_width_traceback, scheduler_crash

WORDS = ("the", "draft", "tree", "verifies", "tokens", "in", "one", "forward", "pass", "and",
         "accepts", "a", "longer", "prefix", "so", "decoding", "runs", "faster")


def generate(cfg: Config, ticket: Ticket, max_tokens: int) -> Iterator[str]:
    """Yield text pieces, one per decode step, once the request has a running slot and its
    prefill is done (batching.py); keeps the counters SGLang reports."""
    maybe_crash_on_first_request(cfg)
    start = time.perf_counter()
    prompt_tokens = ticket.prompt_tokens
    rng = random.Random(prompt_tokens * 7919 + max_tokens)
    batching.admit(ticket)
    try:
        yield from _decode(cfg, ticket, max_tokens, start, rng)
    finally:
        batching.leave()


def _decode(cfg: Config, ticket: Ticket, max_tokens: int, start: float,
            rng: random.Random) -> Iterator[str]:
    prompt_tokens = ticket.prompt_tokens
    with STATE.lock:
        STATE.running += 1
        STATE.num_requests += 1
        STATE.prompt_tokens += prompt_tokens
        STATE.cached_tokens += ticket.cached
        STATE.cache_hit_rate = ticket.cached / prompt_tokens
        STATE.tokens_in_use += prompt_tokens
        prefill_line(prompt_tokens - ticket.cached, ticket.cached, STATE.running - 1)
    produced, last = 0, start
    try:
        while produced < max_tokens:
            if FAIL == "hang-serve" and STATE.generation_tokens >= HANG_AFTER_TOKENS:
                hang()
            time.sleep(TOKEN_S)
            n = step_tokens(cfg, rng, max_tokens - produced)
            piece = "".join(" " + WORDS[(produced + i) % len(WORDS)] for i in range(n))
            t = time.perf_counter()
            record_step(cfg, n, t - last, first=produced == 0, since_start=t - start)
            produced, last = produced + n, t
            yield piece
    finally:
        with STATE.lock:
            STATE.running -= 1
            STATE.tokens_in_use -= prompt_tokens + produced
            STATE.e2e.observe(time.perf_counter() - start)


def step_tokens(cfg: Config, rng: random.Random, left: int) -> int:
    if not cfg.speculative:
        return 1
    mean, spread = ACCEPT_LEN, 1.0
    if FAIL == "accept-collapse" and STATE.ready_at and (
            time.time() - STATE.ready_at > COLLAPSE_AFTER_S):
        mean, spread = COLLAPSED_ACCEPT_LEN, 0.3  # the drafter stopped matching the target
    accepted = max(1, min(cfg.block, round(rng.gauss(mean, spread))))
    return min(accepted, left)


def record_step(cfg: Config, n: int, gap: float, first: bool, since_start: float) -> None:
    with STATE.lock:
        STATE.generation_tokens += n
        STATE.tokens_in_use += n
        STATE.decode_steps += 1
        STATE.accept_tokens += n
        STATE.verify_steps += 1
        STATE.window_tokens += n
        STATE.window_steps += 1
        STATE.last_gen_throughput = n / gap if gap > 0 else 0.0
        if first:
            STATE.ttft.observe(since_start)
        else:
            STATE.itl.observe(gap / n)
        if STATE.decode_steps % cfg.decode_log_interval == 0:
            STATE.close_window()
            decode_line(cfg)


def hang() -> None:
    """hang-serve: the scheduler stops (a deadlock, a GPU that never returns) while the HTTP
    server goes on: every generation waits without end, a stream's head sent and no more
    events, /health still 200 (as SGLang's without SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION),
    /health_generate never answered. Only SIGTERM ends it."""
    while True:
        time.sleep(3600)


def maybe_crash_on_first_request(cfg: Config) -> None:
    if FAIL != "ddtree-width":
        return
    with STATE.lock:
        if STATE.first_request_seen:
            return
        STATE.first_request_seen = True
    scheduler_crash(cfg, ddtree_width_traceback(cfg))


def start_traffic(cfg: Config) -> None:
    """TEST_ENGINE_TRAFFIC clients that keep the engine decoding (charts, alerts)."""
    for client in range(TRAFFIC):
        threading.Thread(target=_client_loop, args=(cfg, client), daemon=True,
                         name=f"traffic-{client}").start()


def _client_loop(cfg: Config, client: int) -> None:
    rng = random.Random(client)
    while True:
        words = [f"t{client}-{rng.random()}"] * rng.randint(64, 512)  # never a cache hit
        for _ in generate(cfg, Ticket(words), rng.randint(32, 256)):
            pass
        time.sleep(rng.uniform(0.0, 0.3))
