"""How long a call to an engine may wait (web/gateway/upstream.py's client, its Bounds set
by the gateway from its settings: docs/gateway.md's "Bounded waits"), and the errors that
end it.

The first byte of the answer's body comes within `first_byte_s` of the request going out
(a stream's first event comes after the engine's queue and prefill), then no silence longer
than `idle_s`; a whole answer (its first byte is its last token's) may wait on to `whole_s`
while the engine's /health answers each `first_byte_s` (`healthy`). An engine frozen while
its kernel still answers (a paused container or host, a hung scheduler) ends in
UpstreamTimeout instead of a wait without end. A peer that vanished (its host killed or cut
off: no reset ever comes) is found sooner by TCP itself (`watch_peer`): keep-alive probes
after DEAD_PEER_IDLE_S of silence, and the connection given up once DEAD_PEER_S pass with a
probe or a request unanswered by the peer's kernel, so a request relayed to a host that
died fails over in seconds.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEAD_PEER_IDLE_S = 2  # silence before the first keep-alive probe
DEAD_PEER_S = 6  # unanswered this long (probes or the request's bytes): the peer is gone


class UpstreamError(Exception):
    """The engine could not be reached, or broke off (or spoke something other than HTTP)."""


class UpstreamTimeout(UpstreamError):
    """The engine sent nothing for longer than the call's Bounds allow."""


@dataclass(frozen=True)
class Bounds:
    """How long a call waits on the engine (None: no bound).

    first_byte_s: from the request written to the first byte of the answer's body;
    idle_s: the longest silence after that byte (time the client is slow to take what came
    does not count); health_url and whole_s: an answer not begun by first_byte_s waits on,
    to whole_s in all, while a GET of health_url answers 200 (asked again each first_byte_s):
    a whole answer's first byte is its last token's, so a live engine's long generation is
    not cut, while a frozen one (no answer to /health either) is given up at once."""

    first_byte_s: float | None = None
    idle_s: float | None = None
    health_url: str = ""
    whole_s: float | None = None


NO_BOUNDS = Bounds()


def watch_peer(sock: Any) -> None:
    """Keep-alive probes and a user timeout (Linux's TCP options), where the platform has
    them: a dead peer's connection ends in DEAD_PEER_S, a live one is never cut."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", DEAD_PEER_IDLE_S), ("TCP_KEEPINTVL", 1),
                        ("TCP_KEEPCNT", DEAD_PEER_S - DEAD_PEER_IDLE_S),
                        ("TCP_USER_TIMEOUT", DEAD_PEER_S * 1000)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


PROBE_TIMEOUT_S = 2.0


async def healthy(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a GET of `url` (an engine's /health, or /health_generate, which makes one
    token) answers 200 within `timeout_s` (SGLang's /health: 503 while it cannot serve)."""
    parts = urlsplit(url)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            try:
                writer.write(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                             "Connection: close\r\n\r\n".encode("latin-1"))
                line = await reader.readline()
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError):
        return False
    return line.split()[1:2] == [b"200"]
