"""An engine container's output as lines: Docker's multiplexed frames, split and decoded.

stdout and stderr are kept apart; with timestamps each line carries Docker's time of it
(the engine agent's cursor); with partials the unterminated pieces of a line (a tqdm bar
redrawing with "\\r") come as they are written, for live progress.
"""

from __future__ import annotations

import codecs
import itertools
import re
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from docker.utils.socket import frames_iter

from appliance.logs.stamps import parse_docker_ts, split_docker_stamp

__all__ = ["LogLine", "attach_frames", "chunked_blocks", "lines_of", "log_frames",
           "parse_docker_ts"]

StreamName = Literal["stdout", "stderr"]
STREAM_NAMES: dict[int, StreamName] = {1: "stdout", 2: "stderr"}
# The log stream is read a block at a time; after a block smaller than READ_FULL_BYTES the
# reader waits READ_LINGER_S for more to gather. Docker writes each line as an HTTP chunk,
# so a reader that keeps up took one small read (a wake-up, a system call and urllib3's
# parse of the chunk) per line: 22 us of the agent's CPU per line at 10,000 lines/s
# (docs/performance.md, Log path). A line waits at most this much longer.
READ_BYTES = 1 << 16
READ_FULL_BYTES = 1 << 14
READ_LINGER_S = 0.002


@dataclass(frozen=True)
class LogLine:
    """One output line of an engine container, from the stream it was written to.

    `text` is a whole line without its "\\n"; tqdm's "\\r" updates stay inside it.
    `partial` lines (only with follow_logs(partials=True)) are the pieces of a line still
    being written (a progress bar redrawing with "\\r"), yielded as they arrive so
    progress is live; the whole line follows, non-partial, once its "\\n" arrives.
    Store only non-partial lines.
    """

    stream: StreamName
    text: str
    partial: bool = False
    ts_ns: int | None = None  # Docker's timestamp of the line (follow_logs(timestamps=True))


def lines_of(frames: Iterable[tuple[int, bytes]], partials: bool = False,
             timestamps: bool = False) -> Iterator[LogLine]:
    """Frames (stream id, bytes) -> lines, each stream split on "\\n" on its own."""
    splitter = _LineSplitter(partials, stamped=timestamps)
    stamped = _Stamps() if timestamps else None
    pieces = (piece for stream_id, data in frames
              for piece in splitter.feed(STREAM_NAMES.get(stream_id, "stdout"), data))
    for stream, text, partial in itertools.chain(pieces, splitter.flush()):
        if stamped is None:
            yield LogLine(stream, text, partial)
        else:
            yield stamped.line(stream, text, partial)


def log_frames(
    api: Any, container_id: str, since: float | None, timestamps: bool = False,
    follow: bool = True, runs: bool = False,
) -> Iterator[tuple[int, bytes]]:
    """Raw (stream id, bytes) frames of `docker logs [--follow]` (a non-tty container);
    with `runs`, the frames of one read joined where lines_of splits them the same (see
    _read_frames).

    docker-py's public logs() drops the stream id of each frame and attach() cannot
    start at `since`, so this issues the same request and keeps the ids. Like
    docker-py's logs(), a follow turns the socket timeout off: a quiet engine (a long
    weight load) is not an error. Without `follow` it ends at what Docker has stored,
    under the client's timeout.
    """
    params: dict[str, Any] = {"stdout": 1, "stderr": 1, "follow": int(follow),
                              "timestamps": int(timestamps)}
    if since is not None:
        params["since"] = f"{since:.6f}"
    response = api._get(api._url("/containers/{0}/logs", container_id),
                        params=params, stream=True)
    api._raise_for_status(response)  # an APIError: the caller says which container
    if follow:
        api._disable_socket_timeout(api._get_raw_response_socket(response))
    try:
        yield from _read_frames(response.raw, runs)
    finally:
        response.close()

def attach_frames(api: Any, container_id: str) -> Iterator[tuple[int, bytes]]:
    """`docker attach` with logs: the live stdio as written, not line-buffered."""
    params = {"logs": 1, "stdout": 1, "stderr": 1, "stream": 1}
    response = api._post(api._url("/containers/{0}/attach", container_id),
                         headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                         params=params, stream=True)
    api._raise_for_status(response)
    sock = api._get_raw_response_socket(response)
    api._disable_socket_timeout(sock)
    try:
        yield from _read_socket_frames(sock)
    finally:
        response.close()


def _read_socket_frames(sock: Any) -> Iterator[tuple[int, bytes]]:
    for stream_id, data in frames_iter(sock, False):
        if data:
            yield int(stream_id), bytes(data)


def _read_frames(raw: Any, runs: bool = False) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed log stream: 8-byte header (stream id, size), then the payload.

    Docker writes each log line as one frame in one HTTP chunk; the body is read a block at
    a time (chunked_blocks: all the whole chunks that arrived, joined) and the frames are
    cut out of it (the agent's profiles: two buffered reads per frame, then urllib3's read
    of each chunk, were a fifth of the agent's CPU). With `runs`, the frames of one block
    come joined while they are of one stream and each before ends its line: lines_of
    splits a run into the same lines as its frames one by one (a frame that continues an
    unended line, Docker's cut of a line over 16 KiB, starts a run of its own), with one
    decode and one split a block instead of one a line."""
    if not (raw.chunked and raw.supports_chunked_reads()):
        yield from _read_frames_unchunked(raw)
        return
    body = getattr(raw._fp, "fp", None)  # the socket's buffered reader, after the headers
    blocks = (chunked_blocks(body) if hasattr(body, "read1") and not raw.chunk_left
              else raw.read_chunked(decode_content=False))
    buffer = b""
    run_id, run = -1, list[bytes]()  # with `runs`: the block's run so far
    for chunk in blocks:
        buffer = buffer + chunk if buffer else chunk
        start, end = 0, len(buffer)
        while end - start >= 8:
            length = int.from_bytes(buffer[start + 4:start + 8], "big")
            if end - start - 8 < length:
                break  # the rest of this frame comes in the next chunk
            payload = buffer[start + 8:start + 8 + length]
            if not payload:
                pass  # an empty frame carries nothing
            elif not runs:
                yield buffer[start], payload
            elif buffer[start] == run_id and run[-1][-1:] == b"\n":
                run.append(payload)
            else:
                if run:
                    yield run_id, run[0] if len(run) == 1 else b"".join(run)
                run_id, run = buffer[start], [payload]
            start += 8 + length
        if run:
            yield run_id, run[0] if len(run) == 1 else b"".join(run)
            run_id, run = -1, []
        buffer = buffer[start:]


def chunked_blocks(body: Any) -> Iterator[bytes]:
    """An HTTP/1.1 chunked body (RFC 9112 7.1) read a block at a time: the payload of each
    read's whole chunks, joined. Extensions after the size are ignored, as are trailers
    after the last chunk; a body cut short raises (as urllib3 does), so the follower
    resumes from its cursor and a line cut in half is never taken for a whole one."""
    buffer = b""
    while True:
        data = body.read1(READ_BYTES)
        if not data:
            raise ConnectionError("the log stream ended inside its HTTP chunks")
        buffer = buffer + data if buffer else data
        payloads: list[bytes] = []
        pos, end = 0, len(buffer)
        while True:
            eol = buffer.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buffer[pos:eol].split(b";", 1)[0], 16)
            if size == 0:  # the last chunk: the stream is over
                if payloads:
                    yield b"".join(payloads)
                return
            start = eol + 2
            if end - start < size + 2:
                break  # the rest of this chunk comes with a later read
            payloads.append(buffer[start:start + size])
            pos = start + size + 2
        buffer = buffer[pos:]
        if payloads:
            yield payloads[0] if len(payloads) == 1 else b"".join(payloads)
        if len(data) < READ_FULL_BYTES:
            time.sleep(READ_LINGER_S)  # let more lines gather (see READ_LINGER_S)


def _read_frames_unchunked(raw: Any) -> Iterator[tuple[int, bytes]]:
    while True:
        header = raw.read(8)
        if len(header) < 8:
            return
        stream_id, length = struct.unpack(">BxxxL", header)
        data = raw.read(length) if length else b""
        if length and not data:
            return
        if data:
            yield stream_id, data


Piece = tuple[StreamName, str, bool]  # stream, text, partial


class _LineSplitter:
    """Splits each stream's bytes on "\\n" (not "\\r"), decoding UTF-8 incrementally."""

    def __init__(self, partials: bool = False, stamped: bool = False) -> None:
        self._partials = partials
        self._stamped = stamped
        self._pending: dict[StreamName, str] = {"stdout": "", "stderr": ""}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in
                          self._pending}

    def feed(self, stream: StreamName, data: bytes) -> list[Piece]:
        pending = self._pending[stream]
        if pending and self._stamped and data[:4].isdigit():
            # Docker cuts a line over 16 KiB into several messages and stamps each one:
            # a continuation's stamp is not part of the line (the line has its first's).
            space = data.find(b" ", 0, 40)
            data = data[space + 1:] if space > 0 else data
        text = self._decoders[stream].decode(data)
        if "\x00" in text:
            # PostgreSQL's jsonb cannot hold a NUL: a line with one failed its whole batch,
            # on every retry from the cursor, and nothing after it was stored again.
            text = text.replace("\x00", "\ufffd")
        pieces = (pending + text if pending else text).split("\n")
        self._pending[stream] = pieces.pop()
        out = [(stream, line, False) for line in pieces]
        if self._partials:
            tail = text.rsplit("\n", 1)[-1]
            if tail:
                out.append((stream, tail, True))
        return out

    def flush(self) -> Iterator[Piece]:
        for stream, rest in self._pending.items():
            rest += self._decoders[stream].decode(b"", final=True)
            if rest:
                yield stream, rest, False
            self._pending[stream] = ""


# The stamp as Docker writes it, and the space after it; any other form (an offset, more
# than nine fraction digits) takes split_docker_stamp's general reading.
_DOCKER_STAMP = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?Z ")


class _Stamps:
    """Splits Docker's `<RFC 3339 time> ` prefix off lines read with timestamps. The whole
    seconds of a stamp repeat for thousands of lines: they are converted once each."""

    def __init__(self) -> None:
        self._seconds: dict[str, int] = {}

    def line(self, stream: StreamName, text: str, partial: bool) -> LogLine:
        found = _DOCKER_STAMP.match(text)
        if found is not None:  # Docker's own form (UTC, RFC 3339 nano): one match a line
            whole, frac = found.groups()
            seconds = self._seconds.get(whole)
            if seconds is None:
                try:
                    seconds = parse_docker_ts(whole + "Z")
                except ValueError:  # the shape of a time, not a time (a month 13)
                    return LogLine(stream, text, partial)
                if len(self._seconds) > 1000:
                    self._seconds.clear()
                self._seconds[whole] = seconds
            nanos = int((frac + "000000000")[:9]) if frac else 0
            return LogLine(stream, text[found.end():], partial, seconds + nanos)
        stamp, rest = split_docker_stamp(text)  # another form: rare, read in full
        if stamp is None:
            return LogLine(stream, text, partial)
        try:
            return LogLine(stream, rest, partial, parse_docker_ts(stamp))
        except ValueError:
            return LogLine(stream, text, partial)
