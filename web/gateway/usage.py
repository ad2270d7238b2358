"""Usage as the gateway counts it: the engine's own counts read out of what passes (a
body's `usage`, a stream's usage chunk, asked for on the client's behalf and dropped when
the client did not ask), stored per key and deployment in group commits before the
response's end goes out, so a caller that reads its usage right after sees it counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from web.asgitypes import Send
from web.gateway import services
from web.gateway.admission import Refusal
from web.gateway.bounds import UpstreamError

DONE = b"data: [DONE]\n\n"


@dataclass
class UsageWriter:
    """Group commit of usage: a request waits until its counts are stored (so a caller that
    reads its usage right after its response sees it), and the requests that end while a
    write is under way are stored by the next write, together."""

    pending: list[tuple[services.Usage, asyncio.Future[None]]] = field(default_factory=list)
    writing: bool = False
    writes: int = 0  # how many writes stored how many requests: what the grouping saves
    stored: int = 0

    async def record(self, usage: services.Usage) -> None:
        done = asyncio.get_running_loop().create_future()
        self.pending.append((usage, done))
        if not self.writing:
            self.writing = True
            asyncio.ensure_future(self._write())
        await done

    async def _write(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                self.writes, self.stored = self.writes + 1, self.stored + len(batch)
                try:
                    await sync_to_async(_record_usage, thread_sensitive=False)(
                        usages=[usage for usage, _ in batch])
                except Exception as exc:  # noqa: BLE001 - each waiting request gets it
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                else:
                    for _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self.writing = False


_USAGE: dict[int, UsageWriter] = {}


def usage_writer() -> UsageWriter:
    """One per event loop, as the HTTP session."""
    return _USAGE.setdefault(id(asyncio.get_running_loop()), UsageWriter())


def _record_usage(*, usages: list[services.Usage]) -> None:
    try:
        services.usage_record_many(usages=usages)
    finally:
        connection.close()  # off Django's request cycle: hand the connection back


USAGE_OPTION = b',"stream_options":{"include_usage":true}}'


def with_usage_option(body: bytes, data: dict[str, Any]) -> bytes:
    """The request body (`data` is what it parsed to) with stream_options.include_usage
    set. Without stream_options in it, the option is appended to the object as the client
    wrote it: a long prompt's JSON is not encoded again (a 130 kB body took 105 us more to
    encode than to parse, on the path to the first byte). Otherwise, or when the body is not
    plain UTF-8 JSON (an object's first and last bytes not its braces), it is re-encoded."""
    if "stream_options" not in data:
        end = body.rstrip()
        if body.lstrip()[:1] == b"{" and end[-1:] == b"}":
            return end[:-1] + USAGE_OPTION
    return json.dumps({**data, "stream_options": {
        **(data.get("stream_options") or {}), "include_usage": True}}).encode()


def asked_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


@dataclass
class UsageTap:
    """Reads the engine's usage out of what passes, and (strip) drops the usage-only chunk
    the gateway asked for on the client's behalf. Bytes pass unchanged otherwise: events go
    out whole, as soon as their closing blank line has arrived."""

    strip: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: bool = False
    done: bool = False  # the engine's [DONE] came
    sent_body: bool = False  # any byte of the body went to the client
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # the response's own
    replica: int = 0
    failure: UpstreamError | None = None  # why the last replica tried gave no answer
    _buffer: bytes = b""

    def restart(self) -> None:
        """Forget a replica's stream that broke before its first event (another's follows)."""
        self._buffer, self.done = b"", False

    def take_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        end = self._buffer.rfind(b"\n\n")
        if end < 0:
            return b""
        ready, self._buffer = self._buffer[:end + 2], self._buffer[end + 2:]
        if b'"usage"' in ready:
            ready = b"".join(event + b"\n\n" for event in ready.split(b"\n\n")[:-1]
                             if self._keep(event))
        if ready.endswith(DONE):
            # Held back until usage is recorded: a client that stops reading at [DONE] and
            # looks at its key's usage sees this request counted.
            ready, self._buffer = ready[:-len(DONE)], DONE + self._buffer
            self.done = True
        return ready

    def broken(self, error: Refusal) -> None:
        """The stream's end when the engine broke it off: an event half-way through is
        dropped, and the client is told, as SGLang tells a stream's own error: an `error`
        event, then [DONE] (so an OpenAI client raises instead of reading a short answer
        as whole)."""
        event = b"data: " + json.dumps(error.body()).encode() + b"\n\n"
        self._buffer = event + DONE

    def _keep(self, event: bytes) -> bool:
        payload = event.partition(b"data: ")[2]
        if not payload.startswith(b"{"):
            return True
        try:
            chunk = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(chunk, dict) or not isinstance(chunk.get("usage"), dict):
            return True
        self.take_usage(chunk["usage"])
        return not (self.strip and chunk.get("choices") == [])

    def hold(self, data: bytes) -> None:
        self._buffer += data

    def rest(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest

    async def finish(self, send: Send) -> None:
        """The response's end, sent after usage is recorded so a caller that reads usage
        right after its response sees it counted."""
        if self.started:
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": self.rest()})
