"""A client that resets its connection mid-answer leaves no traceback in the test engine's
output, as uvicorn (SGLang's server) prints none: the appliance's log reader takes any
traceback for the engine's own error (a CI run diagnosed a killed engine from one). The
test engine runs as a process of this machine (no Docker)."""

from __future__ import annotations

import json
import socket
import struct
import time

import requests

from tests.testengine.test_recorded_speculation import local_engine


def _reset_mid_stream(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 2000,
                       "messages": [{"role": "user", "content": "count"}]}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # An RST, not a FIN: the server's next write meets a reset connection.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_gone_mid_answer_prints_no_traceback() -> None:
    with local_engine(TEST_ENGINE_TOKEN_S="0.005") as (url, out):
        for _ in range(3):
            _reset_mid_stream(url)
        time.sleep(1.0)  # the server's writes after the resets
        # It serves on, and said nothing of the clients gone.
        assert requests.get(f"{url}/health", timeout=5).status_code == 200
        printed = out.read_text()
    assert "Traceback" not in printed and "Exception occurred" not in printed, printed[-2000:]
    assert "POST /v1/chat/completions" in printed  # the access lines are there: it was read
