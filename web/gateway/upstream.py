"""The gateway's client to the engines: HTTP/1.1 over pooled keep-alive connections, parsed by
httptools (llhttp, the C parser uvicorn itself serves the panel with).

Why not aiohttp's client (the gateway's before this one): its generality cost. Against it in
the same hour (`bench/gateway_overhead.py --streams 0 --requests 1000`), this client took
the added time to first byte from 1.02 to 0.70 ms at p50 and from 2.28 to 1.20 ms at p99,
and the panel's CPU for a 32-token stream from 9.8 to 8.7 ms.

What it does: keep-alive reuse; one retry on a fresh connection when a pooled one fails
before any byte of the answer came (the engine's idle timeout struck as the request went
out); back-pressure (the engine's socket unread while a slow client has not taken what is
buffered); the connection closed, so the engine stops generating, when the caller leaves
early or is cancelled; each call's wait bounded (web/gateway/bounds.py) by one timer, not
one per chunk, never counting time the socket is paused for a slow client.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from web.gateway.bounds import (
    NO_BOUNDS,
    Bounds,
    UpstreamError,
    UpstreamTimeout,
    healthy,
    watch_peer,
)

CONNECT_TIMEOUT_S = 10.0
HIGH_WATER = 256 * 1024  # bytes held for a slow client before the engine's socket is paused
LOW_WATER = 64 * 1024


class _Exchange(asyncio.Protocol):
    """One connection; one request and response on it at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.pooled_in: list[_Exchange] | None = None  # the idle list it waits in, if any
        self.timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.complete = False  # the whole response is in
        self.keep_alive = False  # ... and the engine keeps the connection open after it
        self.received = False  # any byte of it came
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self._unwatch()
        self.bounds = NO_BOUNDS
        self.sent_at = 0.0
        self.body_at: float | None = None  # when the body's first byte came
        self.active_at = 0.0  # the last byte of body that came, or the caller took
        self.probing = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"the engine's answer is not HTTP: {exc}"))
            self.close()

    def eof_received(self) -> None:
        self.closed = True  # at once: connection_lost comes a loop turn later

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.pooled_in is not None:  # closed by the engine while idle: out of the pool
            self.pooled_in.remove(self)
            self.pooled_in = None
        if self.complete:
            return
        if self.error is None and self.head.done() and not self._framed():
            self._end()  # a body that ends with the connection: it has ended
        else:
            self._fail(UpstreamError(f"the engine closed the connection: {exc or 'EOF'}"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.active_at = asyncio.get_running_loop().time()
        if self.body_at is None:
            self.body_at = self.active_at
            if self.timer is None and self.bounds.idle_s is not None:
                self._watch_at(self.active_at + self.bounds.idle_s)
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # (False once the callback is over)
        self._end()

    # -- the rest
    def _end(self) -> None:
        self.complete = True
        self._unwatch()
        if not self.head.done():
            self.head.set_result(None)
        self._wake()

    def _framed(self) -> bool:
        return ("content-length" in self.headers
                or "chunked" in self.headers.get("transfer-encoding", "").lower())

    def _fail(self, error: BaseException) -> None:
        self._unwatch()
        if self.error is None:
            self.error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a failure nobody awaits is not logged as lost
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it came, or None at its end."""
        while not self.chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        chunk = self.chunks.popleft()
        if self.timer is not None:
            self.active_at = asyncio.get_running_loop().time()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self.chunks

    def close(self) -> None:
        self.closed = True
        self._unwatch()
        if self.transport is not None:
            self.transport.close()

    # -- the call's bounds: one timer, set to the next moment something is due
    def watch(self, bounds: Bounds) -> None:
        """Bound the answer to the request just written (`bounds`, from now)."""
        self.bounds = bounds
        if bounds.first_byte_s is None and bounds.idle_s is None:
            return
        loop = asyncio.get_running_loop()
        self.sent_at = self.active_at = loop.time()
        self._watch_at(float("inf") if bounds.first_byte_s is None
                       else self.sent_at + bounds.first_byte_s)

    def _watch_at(self, when: float) -> None:
        self._unwatch()
        if when != float("inf"):
            self.timer = asyncio.get_running_loop().call_at(when, self._check)

    def _unwatch(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        self.timer = None
        if self.complete or self.error is not None or self.closed:
            return
        bounds, now = self.bounds, asyncio.get_running_loop().time()
        if self.body_at is None:
            assert bounds.first_byte_s is not None
            due = self.sent_at + bounds.first_byte_s
            if now < due:
                self._watch_at(due)
            elif bounds.health_url and bounds.whole_s and now < self.sent_at + bounds.whole_s:
                if not self.probing:
                    self.probing = True
                    task = asyncio.ensure_future(self._probe(now))
                    task.add_done_callback(_retrieved)
            else:
                self._timed_out(f"no answer from the engine in {now - self.sent_at:.0f} s "
                                "(the gateway's first-byte timeout)")
            return
        if bounds.idle_s is None:
            return
        if self.paused or self.chunks:  # the client is slow to take what came, not the engine
            self._watch_at(now + bounds.idle_s)
            return
        due = self.active_at + bounds.idle_s
        if now < due:
            self._watch_at(due)
        else:
            self._timed_out(f"the engine sent nothing for {now - self.active_at:.0f} s in the "
                            "middle of its answer (the gateway's idle-stream timeout)")

    async def _probe(self, since: float) -> None:
        """Past the first-byte timeout with nothing: waits on while the engine's /health
        answers (a long whole answer), gives up when it does not (frozen)."""
        bounds, sent_at = self.bounds, self.sent_at
        assert bounds.first_byte_s is not None and bounds.whole_s is not None
        try:
            alive = await healthy(bounds.health_url)
        finally:
            if self.sent_at == sent_at:
                self.probing = False
        if self.sent_at != sent_at:
            return  # the connection went on to another request meanwhile
        if self.complete or self.error is not None or self.closed or self.body_at is not None:
            if self.body_at is not None and not self.complete and self.error is None:
                self._check()  # the answer began meanwhile: the idle bound from here
            return
        if not alive:
            self._timed_out(f"no answer from the engine in "
                            f"{asyncio.get_running_loop().time() - self.sent_at:.0f} s, and "
                            "its /health does not answer (the gateway's first-byte timeout)")
            return
        self._watch_at(min(since + bounds.first_byte_s, self.sent_at + bounds.whole_s))

    def _timed_out(self, why: str) -> None:
        self._fail(UpstreamTimeout(why))
        self.close()  # the engine drops the request's work (as when a client leaves)


@dataclass
class Response:
    """An engine's answer: the status and headers are in; the body comes on demand."""

    status: int
    headers: dict[str, str]  # names lower-cased
    _exchange: _Exchange

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._exchange.next_chunk()) is not None:
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


@dataclass
class Pool:
    """Keep-alive connections per engine (host, port), for one event loop."""

    loop: asyncio.AbstractEventLoop
    idle: dict[tuple[str, int], list[_Exchange]] = field(default_factory=dict)

    def post(self, url: str, body: bytes, content_type: str = "application/json",
             authorization: str = "",
             connect_timeout_s: float = CONNECT_TIMEOUT_S,
             bounds: Bounds = NO_BOUNDS) -> _Call:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamError(f"{url!r} is not an http:// URL")
        host, port = parts.hostname, parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                + (f"Authorization: {authorization}\r\n" if authorization else "")
                + "Accept-Encoding: identity\r\n\r\n").encode("latin-1")
        return _Call(self, (host, port), head + body, connect_timeout_s, bounds)

    async def _connect(self, key: tuple[str, int],
                       timeout_s: float = CONNECT_TIMEOUT_S) -> _Exchange:
        try:
            async with asyncio.timeout(timeout_s):
                transport, exchange = await self.loop.create_connection(_Exchange, *key)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: "
                                f"{exc or 'timed out'}") from exc
        watch_peer(transport.get_extra_info("socket"))
        return exchange

    def _take_idle(self, key: tuple[str, int]) -> _Exchange | None:
        idle = self.idle.get(key)
        while idle:
            exchange = idle.pop()
            exchange.pooled_in = None
            if not exchange.closed:
                return exchange
        return None

    async def _send(self, key: tuple[str, int], request: bytes,
                    connect_timeout_s: float = CONNECT_TIMEOUT_S,
                    bounds: Bounds = NO_BOUNDS) -> _Exchange:
        """Write the request, wait for the answer's head (within `bounds`). A pooled
        connection that fails before a byte comes back was closed by the engine in between:
        one fresh try (not after a timeout: that engine is frozen, not gone)."""
        exchange = self._take_idle(key)
        for pooled in (exchange is not None, False):
            if exchange is None:
                exchange = await self._connect(key, connect_timeout_s)
            exchange._reset()
            assert exchange.transport is not None
            try:
                exchange.transport.write(request)
                exchange.watch(bounds)
                await exchange.head
            except (UpstreamError, RuntimeError) as exc:  # RuntimeError: a closed transport
                exchange.close()
                if pooled and not exchange.received and not isinstance(exc, UpstreamTimeout):
                    exchange = None
                    continue
                if isinstance(exc, RuntimeError):
                    raise UpstreamError(f"the connection to the engine closed: {exc}") from exc
                raise
            except BaseException:
                exchange.close()  # cancelled while waiting: the engine drops the request
                raise
            return exchange
        raise AssertionError("unreachable")

    def _release(self, key: tuple[str, int], exchange: _Exchange) -> None:
        if exchange.reusable():
            exchange.pooled_in = self.idle.setdefault(key, [])
            exchange.pooled_in.append(exchange)
        else:
            exchange.close()

    def close(self) -> None:
        for idle in self.idle.values():
            for exchange in list(idle):
                exchange.close()
        self.idle.clear()


@dataclass
class _Call:
    """`async with pool.post(url, body) as response:`; leaving the block early (or being
    cancelled in it) closes the connection, so the engine stops the request's work."""

    pool: Pool
    key: tuple[str, int]
    request: bytes
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    bounds: Bounds = NO_BOUNDS
    _exchange: _Exchange | None = None

    async def __aenter__(self) -> Response:
        self._exchange = await self.pool._send(self.key, self.request, self.connect_timeout_s,
                                               self.bounds)
        return Response(self._exchange.status, self._exchange.headers, self._exchange)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._exchange is not None:
            self.pool._release(self.key, self._exchange)


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # (a probe's own failure is its answer: not alive)


_POOLS: dict[int, Pool] = {}


def pool() -> Pool:
    """The running event loop's pool (uvicorn runs one loop a process)."""
    loop = asyncio.get_running_loop()
    found = _POOLS.get(id(loop))
    if found is None or found.loop is not loop:  # an id is reused after a loop is gone
        found = _POOLS[id(loop)] = Pool(loop)
    return found
