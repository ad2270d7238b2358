"""A loopback OpenAI-compatible streaming server with exact token pacing, for measuring
the benchmark client itself (its accuracy test and its overhead benchmark).

Each request's k-th token is sent at send + ttft + (k-1) * tpot on the event loop's clock
(absolute deadlines, so pacing errors do not add up); usage comes in the last chunk.
On a busy machine the event loop wakes late, so what each stream really did (its first
token and its mean gap, from the request's arrival) is kept, and `GET /paced/actual` hands
those over and forgets them: the ground truth for the client's accuracy test.
With `fail_every=n` every n-th generation request is answered HTTP 503 instead (1: all),
for the benchmark's failure handling.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


class PacedServer:
    def __init__(self, *, ttft_s: float, tpot_s: float, accept_len: float | None = None,
                 fail_every: int = 0):
        self.ttft_s, self.tpot_s, self.accept_len = ttft_s, tpot_s, accept_len
        self.fail_every, self.generations = fail_every, 0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.actual: list[dict[str, float]] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.perf_counter()
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                await self._answer(head.split(b" ", 2)[1].decode(), body, writer, arrived)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _answer(self, path: str, body: bytes, writer: asyncio.StreamWriter,
                      arrived: float) -> None:
        if path.startswith("/paced/actual"):
            self._json(writer, self.actual)
            self.actual = []
        elif path.startswith("/server_info"):
            state = {} if self.accept_len is None else {"avg_spec_accept_length":
                                                        self.accept_len}
            self._json(writer, {"internal_states": [state]})
        elif path.startswith("/v1/models"):
            self._json(writer, {"data": [{"id": "paced"}]})
        else:
            self.generations += 1
            if self.fail_every and self.generations % self.fail_every == 0:
                self._unavailable(writer)
            else:
                await self._stream(json.loads(body or b"{}"), writer, arrived)
        await writer.drain()

    @staticmethod
    def _unavailable(writer: asyncio.StreamWriter) -> None:
        raw = b"simulated overload"
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))

    def _json(self, writer: asyncio.StreamWriter, data: Any) -> None:
        raw = json.dumps(data).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))

    async def _stream(self, req: dict[str, Any], writer: asyncio.StreamWriter,
                      start: float) -> None:
        n = int(req.get("max_tokens") or 16)
        first = last = start
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for k in range(n):
            delay = start + self.ttft_s + k * self.tpot_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self._event(writer, {"choices": [{"index": 0, "delta": {"content": " tok"},
                                              "finish_reason": None}]})
            last = time.perf_counter()
            if k == 0:
                first = last
            await writer.drain()
        self._event(writer, {"choices": [], "usage": {"prompt_tokens": 8,
                                                      "completion_tokens": n}})
        self._chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        self.actual.append({"ttft_s": first - start,
                            "tpot_s": (last - first) / (n - 1) if n > 1 else 0.0})

    def _event(self, writer: asyncio.StreamWriter, data: Any) -> None:
        self._chunk(writer, b"data: " + json.dumps(data).encode() + b"\n\n")

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def _main(ttft_s: float, tpot_s: float, fail_every: int = 0) -> None:
    server = PacedServer(ttft_s=ttft_s, tpot_s=tpot_s, fail_every=fail_every)
    print(await server.start(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    # python -m appliance.bench.paced TTFT_S TPOT_S [FAIL_EVERY]: prints its URL, serves
    # until killed.
    import sys

    asyncio.run(_main(float(sys.argv[1]), float(sys.argv[2]),
                      int(sys.argv[3]) if len(sys.argv) > 3 else 0))
