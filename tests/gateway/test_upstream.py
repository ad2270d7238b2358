"""The gateway's engine client (web/gateway/upstream.py) against real loopback HTTP servers:
each test's server is a few lines of asyncio that answer as a test scripts them, and count
the connections and requests they saw."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from web.gateway.bounds import Bounds, UpstreamError, UpstreamTimeout
from web.gateway.upstream import HIGH_WATER, Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


@dataclass
class Server:
    """Reads each request (head and Content-Length body), then lets `answer` write a reply;
    the connection stays open for the next request while `answer` returns True."""

    answer: Handler
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                if not await self.answer(reader, writer, len(self.requests)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()


@contextlib.asynccontextmanager
async def serving(answer: Handler) -> AsyncIterator[tuple[Server, Pool]]:
    """A scripted server, and a pool of the gateway's client to call it with."""
    server = Server(answer)
    async with await server.start():
        pool = Pool(asyncio.get_running_loop())
        try:
            yield server, pool
        finally:
            pool.close()


def whole(body: bytes, *extra: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + b"".join(extra) + b"\r\n" + body)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def test_connections_are_kept_alive_and_reused() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(whole(b'{"n": %d}' % n))
        return True

    async def test() -> None:
        async with serving(answer) as (server, pool):
            for n in (1, 2, 3):
                async with pool.post(server.url, b'{"q": 1}') as response:
                    assert response.status == 200
                    assert response.headers["content-type"] == "application/json"
                    assert await response.read() == b'{"n": %d}' % n
            assert server.connections == 1
            assert len(server.requests) == 3
            assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert server.requests[0].endswith(b'Content-Length: 8\r\n'
                                               b'Accept-Encoding: identity\r\n\r\n{"q": 1}')
    run(test)


def test_a_stream_comes_piece_by_piece_as_the_engine_writes_it() -> None:
    go_on = asyncio.Event()

    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD + chunk(b"data: one\n\n"))
        await go_on.wait()  # the second piece only once the first was read
        writer.write(chunk(b"data: two\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    async def test() -> None:
        async with serving(answer) as (server, pool):
            async with pool.post(server.url, b"{}") as response:
                pieces = response.chunks()
                assert await anext(pieces) == b"data: one\n\n"
                go_on.set()
                assert b"".join([p async for p in pieces]) == b"data: two\n\ndata: [DONE]\n\n"
            async with pool.post(server.url, b"{}") as response:  # the same connection
                assert await response.read() == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
            assert server.connections == 1
    run(test)


def test_a_connection_the_engine_closes_while_idle_leaves_the_pool() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(whole(b"ok"))
        await writer.drain()
        return False  # the engine closes every connection after one answer

    async def test() -> None:
        async with serving(answer) as (server, pool):
            for _ in range(3):
                async with pool.post(server.url, b"{}") as response:
                    assert await response.read() == b"ok"
                await server.closed.wait()
                server.closed.clear()
                await asyncio.sleep(0.05)  # the close reaches the client's side
                assert pool.idle[("127.0.0.1", server.port)] == []
            assert server.connections == 3
            assert len(server.requests) == 3
    run(test)


def test_a_pooled_connection_that_closes_on_the_next_request_is_retried_once() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        if n == 2:  # an engine whose idle timeout struck as the request came: no answer
            return False
        writer.write(whole(b"ok %d" % n))
        return True

    async def test() -> None:
        async with serving(answer) as (server, pool):
            for expected in (b"ok 1", b"ok 3"):
                async with pool.post(server.url, b"{}") as response:
                    assert await response.read() == expected
            assert server.connections == 2
            assert len(server.requests) == 3
    run(test)


def test_a_body_that_ends_with_the_connection_is_read_whole_and_not_pooled() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\nno length")
        return False

    async def test() -> None:
        async with serving(answer) as (server, pool):
            for _ in range(2):
                async with pool.post(server.url, b"{}") as response:
                    assert response.status == 502
                    assert await response.read() == b"no length"
            assert server.connections == 2
    run(test)


def test_leaving_a_stream_early_closes_the_connection_so_the_engine_stops() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD)
        while True:  # an endless generation, until the client goes away
            writer.write(chunk(b"data: more\n\n"))
            await writer.drain()
            await asyncio.sleep(0.01)

    async def test() -> None:
        async with serving(answer) as (server, pool):
            async with pool.post(server.url, b"{}") as response:
                assert await anext(response.chunks()) == b"data: more\n\n"
            await asyncio.wait_for(server.closed.wait(), 5)
    run(test)


def test_a_caller_cancelled_while_waiting_closes_the_connection() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        assert await reader.read(1) == b""  # a prefill that never ends, until the client goes
        return False

    async def test() -> None:
        async with serving(answer) as (server, pool):

            async def call() -> None:
                async with pool.post(server.url, b"{}"):
                    pass

            task = asyncio.ensure_future(call())
            while not server.requests:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(server.closed.wait(), 5)
            assert not pool.idle.get(("127.0.0.1", server.port))
    run(test)


def test_a_slow_reader_pauses_the_engines_socket_and_loses_nothing() -> None:
    piece = b"x" * 65536
    # Over what the client buffers plus the most both loopback sockets may grow to (the
    # kernel's autotuned maximums, 32 MiB + 4 MiB on this machine kind), so that holding
    # the engine back is the only way the body does not all get sent
    most = HIGH_WATER + sum(int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
                            for name in ("tcp_rmem", "tcp_wmem"))
    pieces = most // len(piece) + 64
    sent = asyncio.Event()

    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD)
        for _ in range(pieces):
            writer.write(chunk(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        sent.set()
        return True

    async def test() -> None:
        async with serving(answer) as (server, pool):
            async with pool.post(server.url, b"{}") as response:
                stream = response.chunks()
                got = len(await anext(stream))
                await asyncio.sleep(0.5)
                assert not sent.is_set(), "the engine could write it all: nothing held it back"
                assert got < HIGH_WATER
                async for data in stream:
                    got += len(data)
            assert got == len(piece) * pieces
            assert sent.is_set()
    run(test)


def test_an_engine_that_breaks_off_mid_body_is_an_error() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        return False  # gone, without the last chunk

    async def test() -> None:
        async with serving(answer) as (server, pool), pool.post(server.url, b"{}") as response:
            with pytest.raises(UpstreamError, match="closed the connection"):
                async for _ in response.chunks():
                    pass
    run(test)


def test_no_engine_or_no_http_is_an_error_naming_it() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        return True

    async def test() -> None:
        pool = Pool(asyncio.get_running_loop())
        with pytest.raises(UpstreamError, match=r"cannot connect to 127\.0\.0\.1:1"):
            async with pool.post("http://127.0.0.1:1/v1/models", b""):
                pass
        server = Server(answer)
        async with await server.start():
            with pytest.raises(UpstreamError, match="not HTTP"):
                async with pool.post(server.url, b"{}"):
                    pass
        with pytest.raises(UpstreamError, match="not an http:// URL"):
            pool.post("https://127.0.0.1/v1/models", b"")
        pool.close()
    run(test)


def test_a_fleet_engines_key_goes_as_a_bearer_header_and_only_when_there_is_one() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(whole(b"{}"))
        return True

    async def test() -> None:
        async with serving(answer) as (server, pool):
            async with pool.post(server.url, b"{}", authorization="Bearer k3y") as response:
                await response.read()
            async with pool.post(server.url, b"{}") as response:
                await response.read()
            assert b"\r\nAuthorization: Bearer k3y\r\n" in server.requests[0]
            assert b"Authorization" not in server.requests[1]
    run(test)


# ------------------------------------------------------------------ bounded waits

def test_a_stream_whose_first_event_does_not_come_times_out_at_the_first_byte_bound() -> None:
    """SGLang sends a stream's head at once and its first event after the prefill: a frozen
    engine's stream has a head and nothing more. The first-byte bound counts to the body."""
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD)
        assert await reader.read(1) == b""  # silent until the client gives up
        return False

    async def test() -> None:
        async with serving(answer) as (server, pool):
            started = asyncio.get_running_loop().time()
            async with pool.post(server.url, b"{}",
                                 bounds=Bounds(first_byte_s=0.3, idle_s=5)) as response:
                assert response.status == 200
                with pytest.raises(UpstreamTimeout, match="first-byte timeout"):
                    await response.read()
            took = asyncio.get_running_loop().time() - started
            assert 0.3 <= took < 0.9, took
            await asyncio.wait_for(server.closed.wait(), 2)  # closed: the engine drops it
    run(test)


def test_a_head_that_never_comes_times_out_and_is_not_retried_on_a_fresh_connection() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        if n == 1:
            writer.write(whole(b"ok"))
            return True
        assert await reader.read(1) == b""  # a frozen engine: its kernel took the request
        return False

    async def test() -> None:
        async with serving(answer) as (server, pool):
            async with pool.post(server.url, b"{}") as response:
                assert await response.read() == b"ok"
            started = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamTimeout):
                async with pool.post(server.url, b"{}", bounds=Bounds(first_byte_s=0.3)):
                    pass
            assert asyncio.get_running_loop().time() - started < 0.9
            assert len(server.requests) == 2  # one wait, not one more on a new connection
    run(test)


def test_a_stream_silent_midway_times_out_at_the_idle_bound_and_a_slow_reader_never() -> None:
    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        writer.write(STREAM_HEAD)
        for _ in range(5):  # steady pieces 0.1 s apart: never idle for 0.3 s
            writer.write(chunk(b"data: x\n\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
        if n == 2:
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return True
        assert await reader.read(1) == b""  # then silent: frozen midway
        return False

    async def test() -> None:
        async with serving(answer) as (server, pool):
            bounds = Bounds(first_byte_s=1, idle_s=0.3)
            async with pool.post(server.url, b"{}", bounds=bounds) as response:
                pieces, started = [], 0.0
                with pytest.raises(UpstreamTimeout, match="idle-stream timeout"):
                    async for piece in response.chunks():
                        pieces.append(piece)
                        started = asyncio.get_running_loop().time()
                silent = asyncio.get_running_loop().time() - started
                assert b"".join(pieces) == b"data: x\n\n" * 5
                assert 0.3 <= silent < 0.9, silent
            # A reader slower than the bound (0.5 s a piece) is not the engine's silence.
            async with pool.post(server.url, b"{}", bounds=bounds) as response:
                got = []
                async for piece in response.chunks():
                    got.append(piece)
                    await asyncio.sleep(0.5)
                assert b"".join(got).endswith(b"data: [DONE]\n\n")
    run(test)


def test_a_whole_answer_waits_past_the_first_byte_bound_while_the_engine_is_alive() -> None:
    """A whole answer's first byte is its last token's: it waits on while the engine's
    /health answers, to the whole-answer bound; a frozen engine's (no /health) is given up
    at the first-byte bound."""
    health_answers = True

    async def answer(reader, writer, n) -> bool:  # type: ignore[no-untyped-def]
        if n == 1:
            await asyncio.sleep(0.8)  # a long generation: past the first-byte bound
            writer.write(whole(b"long"))
            return True
        assert await reader.read(1) == b""  # never answers
        return False

    async def health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if health_answers:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
        else:
            await asyncio.sleep(10)  # frozen: its kernel took the probe, nobody answers

    async def test() -> None:
        nonlocal health_answers
        probe = await asyncio.start_server(health, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        async with probe, serving(answer) as (server, pool):
            bounds = Bounds(first_byte_s=0.3, health_url=f"http://127.0.0.1:{port}/health",
                            whole_s=1.5)
            loop = asyncio.get_running_loop()
            async with pool.post(server.url, b"{}", bounds=bounds) as response:
                assert await response.read() == b"long"
            started = loop.time()
            with pytest.raises(UpstreamTimeout, match="first-byte timeout"):
                async with pool.post(server.url, b"{}", bounds=bounds) as response:
                    pass
            took = loop.time() - started
            assert 1.5 <= took < 2.0, took  # alive all along: the whole-answer bound
            health_answers = False
            started = loop.time()
            with pytest.raises(UpstreamTimeout, match="/health does not answer"):
                async with pool.post(server.url, b"{}", bounds=bounds) as response:
                    pass
            took = loop.time() - started
            assert took < 0.3 + 2.0 + 0.3, took  # the first-byte bound and one probe
    run(test)
