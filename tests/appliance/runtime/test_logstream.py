"""The log stream's HTTP/1.1 chunked reader, over a real socket: Docker's chunks arrive
cut anywhere by the network, and the reader must give back exactly their payloads."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from appliance.runtime.logstream import chunked_blocks


def _chunked(payloads: list[bytes], extension: bytes = b"") -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in payloads)
    return body + b"0\r\n\r\n"


def _read_through_socket(wire: bytes, cut_every: int) -> Iterator[bytes]:
    """The reader's blocks of `wire` sent over a socket pair `cut_every` bytes at a time."""
    ours, theirs = socket.socketpair()

    def send() -> None:
        for i, start in enumerate(range(0, len(wire), cut_every)):
            theirs.sendall(wire[start:start + cut_every])
            if i % 50 == 0:
                time.sleep(0.001)  # so reads end at many different places
        theirs.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    body = ours.makefile("rb")
    try:
        yield from chunked_blocks(body)
    finally:
        sender.join(10)
        body.close()
        ours.close()
        theirs.close()


@pytest.mark.parametrize("cut_every", [1, 7, 100, 4096, 1 << 20])
def test_it_gives_back_every_chunk_payload_in_order_however_the_bytes_arrive(
        cut_every: int) -> None:
    payloads = [b"frame %d " % i * (1 + i % 5) + b"\r\n inside\n" for i in range(300)]
    got = b"".join(_read_through_socket(_chunked(payloads), cut_every))
    assert got == b"".join(payloads)


def test_it_ignores_chunk_extensions() -> None:
    payloads = [b"one", b"two" * 100]
    got = b"".join(_read_through_socket(_chunked(payloads, b";name=value"), 5))
    assert got == b"one" + b"two" * 100


def test_a_body_cut_short_is_an_error_and_not_an_end() -> None:
    # Taken for an end, the half line would be flushed as a whole line and stored.
    wire = _chunked([b"a whole line\n", b"half a line\n"])
    wire = wire[:wire.index(b"half a") + len(b"half a")]
    blocks = _read_through_socket(wire, 3)
    with pytest.raises(ConnectionError):
        for _ in blocks:
            pass


def test_a_body_cut_between_chunks_is_an_error_too() -> None:
    wire = _chunked([b"a whole line\n"])[:-len(b"0\r\n\r\n")]
    with pytest.raises(ConnectionError):
        list(_read_through_socket(wire, 1 << 20))
