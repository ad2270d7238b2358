"""Generation: decode steps, the counters they keep, and the ddtree-width crash."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

from sglang.test_engine import batching, engine
from sglang.test_engine.batching import Ticket
from sglang.test_engine.config import Config
from sglang.test_engine.engine import STATE
from sglang.test_engine.loglines import decode_line, prefill_line
from sglang.test_engine.profile import Acceptance
from sglang.test_engine.settings import (
    ACCEPT_LEN,
    COLLAPSE_AFTER_S,
    COLLAPSED_ACCEPT_LEN,
    FAIL,
    HANG_AFTER_TOKENS,
    PREFILL_TOKEN_S,
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
    batching.admit(ticket)
    try:
        yield from _decode(cfg, ticket, max_tokens, start)
    finally:
        batching.leave()


def _decode(cfg: Config, ticket: Ticket, max_tokens: int, start: float) -> Iterator[str]:
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
    acceptance = Acceptance()
    # Steps keep a schedule (each due at the sum of the step times before it), so that the
    # time Python takes around a sleep does not add up over a request; steps already due
    # when one ends go out together (a loaded CPU sends fewer chunks, never fewer tokens a
    # second). With a recorded TTFT the first token comes with the prefill, at that TTFT,
    # as SGLang's does.
    recorded_ttft = first_token_wait() > 0
    due = time.perf_counter()
    try:
        while produced < max_tokens:
            if FAIL == "hang-serve" and STATE.generation_tokens >= HANG_AFTER_TOKENS:
                hang()
            steps: list[tuple[int, int]] = []  # (tokens out, tokens accepted) per step
            out = 0
            while True:
                if produced + out == 0 and recorded_ttft:
                    n = accepted = 1
                    due = prefill_until(due)
                else:
                    accepted = acceptance.take(accept_mean(cfg), cfg.block) \
                        if cfg.speculative else 1
                    n = min(accepted, max_tokens - produced - out)
                    due += step_s(cfg)
                steps.append((n, accepted))
                out += n
                if produced + out >= max_tokens or due > time.perf_counter():
                    break
                if FAIL == "hang-serve" and STATE.generation_tokens + out >= HANG_AFTER_TOKENS:
                    break  # the steps due past the hang point are never made
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            piece = "".join(" " + WORDS[(produced + i) % len(WORDS)] for i in range(out))
            t = time.perf_counter()
            for i, (n, accepted) in enumerate(steps):
                record_step(cfg, n, (t - last) / len(steps), first=produced == 0 and i == 0,
                            since_start=t - start, accepted=accepted)
            produced, last = produced + out, t
            yield piece
    finally:
        with STATE.lock:
            STATE.running -= 1
            STATE.tokens_in_use -= prompt_tokens + produced
            STATE.e2e.observe(time.perf_counter() - start)


def _running() -> int:
    return max(STATE.running, 1)


def prefill_until(arrived: float) -> float:
    """When the first token is due: the recorded TTFT at the most requests running since
    this one arrived (those that arrive with it share the prefill, as the recorded level's
    did), looked at again until it is due."""
    peak = _running()
    while True:
        peak = max(peak, _running())
        due = arrived + first_token_wait(peak)
        left = due - time.perf_counter()
        if left <= 0:
            return due
        time.sleep(min(left, 0.005))


def first_token_wait(running: int | None = None) -> float:
    """Before the first decode step: the recorded mean TTFT at this many running requests,
    unless the launch paces prefill per token (TEST_ENGINE_PREFILL_TOKEN_S, batching.py) or
    the step itself (TEST_ENGINE_TOKEN_S: a test's own pacing, no recorded TTFT)."""
    if PREFILL_TOKEN_S > 0 or TOKEN_S > 0 or engine.PROFILES is None:
        return 0.0
    return engine.PROFILES.mode.ttft_s(running or _running())


def accept_mean(cfg: Config) -> float:
    """The mean accepted tokens per verify step now: the recording's at this many running
    requests (TEST_ENGINE_ACCEPT_LEN overrides it); under accept-collapse, after the fall,
    the collapsed recording's (TEST_ENGINE_COLLAPSED_ACCEPT_LEN overrides that)."""
    if not cfg.speculative:
        return 1.0
    if FAIL == "accept-collapse" and STATE.ready_at and (
            time.time() - STATE.ready_at > COLLAPSE_AFTER_S):
        if COLLAPSED_ACCEPT_LEN > 0 or engine.COLLAPSED is None:
            return max(COLLAPSED_ACCEPT_LEN, 1.0)
        return engine.COLLAPSED.accept_len(_running())
    if ACCEPT_LEN > 0 or engine.PROFILES is None:
        return max(ACCEPT_LEN, 1.0)
    return engine.PROFILES.mode.accept_len(_running())


def step_s(cfg: Config) -> float:
    """One decode step: TEST_ENGINE_TOKEN_S where set; else, speculative, the recorded time
    per token times the recorded accept length (draft and verify, as a request sees them: a
    recording times them only together), and plain, the no-speculation run's time per token,
    each at this many running requests (profile.py). A step's cost is the recording's
    whatever acceptance a knob plants."""
    if TOKEN_S > 0 or engine.PROFILES is None:
        return TOKEN_S
    running = _running()
    if not cfg.speculative:
        return engine.PROFILES.plain.token_s(running)
    mode = engine.PROFILES.mode
    return mode.token_s(running) * mode.accept_len(running)


def record_step(cfg: Config, n: int, gap: float, first: bool, since_start: float,
                accepted: int | None = None) -> None:
    """`n` tokens out; `accepted` the verify accepted (more than `n` where the request's
    last step was cut at max_tokens: the acceptance SGLang reports is the drafter's)."""
    accepted = n if accepted is None else accepted
    with STATE.lock:
        STATE.generation_tokens += n
        STATE.tokens_in_use += n
        STATE.decode_steps += 1
        STATE.accept_tokens += accepted
        STATE.verify_steps += 1
        STATE.window_tokens += accepted
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
