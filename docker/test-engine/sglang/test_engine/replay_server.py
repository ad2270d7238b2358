"""The HTTP endpoints of a replay (TEST_ENGINE_REPLAY): what the real engine served, recorded.

- /health: 200 once the recorded ready line was printed, 503 before;
- /metrics: the recorded snapshot of this moment of the replay (replay.Replay.metrics);
  503 where the real engine did not answer yet;
- /server_info, /get_server_info: server_info.json; /v1/models: models.json;
- POST /v1/completions, /v1/chat/completions with "stream": the recorded raw SSE chunks
  (sse_completions.txt, sse_chat.txt) byte for byte, with their recorded gaps on the
  replay's clock; without "stream", one answer assembled from those chunks (the recording
  holds no unstreamed answer);
- POST /generate: probe.json's answer to the same prompt (with return_logprob, the
  recorded refusal where the engine refused it); another prompt (the appliance's
  readiness probe) gets the recording's first answer, or one built from its stream.
Live requests print no access line: the output is the recording's alone.
"""

from __future__ import annotations

import json
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from sglang.test_engine.httpserver import EngineHTTPServer
from sglang.test_engine.replay import Replay

STREAMS = {"/v1/completions": "sse_completions.txt", "/v1/chat/completions": "sse_chat.txt"}


def _events(chunks: list[tuple[float, str]]) -> list[dict[str, Any]]:
    out = []
    for _, data in chunks:
        for block in data.split("\n\n"):
            payload = block.removeprefix("data: ").strip()
            if payload and payload != "[DONE]":
                out.append(json.loads(payload))
    return out


def assembled(path: str, chunks: list[tuple[float, str]]) -> dict[str, Any]:
    """The unstreamed answer the recorded stream adds up to (text joined, last finish)."""
    events = _events(chunks)
    choices = [c for e in events for c in e.get("choices", [])]
    usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
    finish = next((c["finish_reason"] for c in reversed(choices) if c.get("finish_reason")),
                  None)
    head = {"id": events[0]["id"], "created": events[0]["created"], "model": events[0]["model"]}
    if path == "/v1/completions":
        text = "".join(c.get("text") or "" for c in choices)
        return {**head, "object": "text_completion", "usage": usage, "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    deltas = [c.get("delta") or {} for c in choices]
    message = {"role": "assistant",
               "content": "".join(d.get("content") or "" for d in deltas) or None,
               "reasoning_content": "".join(d.get("reasoning_content") or "" for d in deltas)
               or None}
    return {**head, "object": "chat.completion", "usage": usage, "choices": [
        {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]}


def probe_answer(replay: Replay, body: dict[str, Any]) -> tuple[int, Any]:
    """probe.json's answer to this prompt; for another prompt the first answer recorded."""
    probes = replay.recording.json_file("probe.json") or []
    wants_logprob = bool(body.get("return_logprob"))
    for probe in probes:
        if probe.get("prompt") != body.get("text"):
            continue
        refused = probe.get("refused")
        if wants_logprob and refused:
            return int(refused["status"]), refused["body"]
        return int(probe["status"]), probe["response"]
    answered = next((p for p in probes if p.get("status") == 200), None)
    if answered:
        return 200, answered["response"]
    return 200, built_answer(replay, body)


def built_answer(replay: Replay, body: dict[str, Any]) -> dict[str, Any]:
    """A /generate answer from the recorded completion stream's first piece of text (the
    recording answered no /generate without return_logprob)."""
    stream = replay.recording.sse(STREAMS["/v1/completions"])
    events = _events(stream[1]) if stream else []
    text = next((c.get("text") for e in events for c in e.get("choices", []) if c.get("text")),
                "")
    return {"text": text, "meta_info": {
        "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": max(1, len(str(body.get("text") or "").split())),
        "completion_tokens": 1, "cached_tokens": 0, "e2e_latency": 0.0}}


class ReplayServer(EngineHTTPServer):
    def __init__(self, address: tuple[str, int], replay: Replay) -> None:
        super().__init__(address, ReplayHandler)
        self.replay = replay


class ReplayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: ReplayServer

    @property
    def replay(self) -> Replay:
        return self.server.replay

    def log_message(self, format: str, *args: Any) -> None:
        return  # the recording holds the engine's access lines

    def send_body(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, body: Any) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_body(status, data, "application/json")

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        routes = {
            "/health": self.health, "/health_generate": self.health,
            "/metrics": self.metrics, "/server_info": self.server_info,
            "/get_server_info": self.server_info, "/v1/models": self.models,
            "/model_info": self.model_info, "/get_model_info": self.model_info,
        }
        routes.get(self.path.split("?", 1)[0], self.not_found)()

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path not in (*STREAMS, "/generate"):
            self.not_found()
        elif not self.replay.ready.is_set():
            self.send_body(503, b"", "text/plain")
        elif path == "/generate":
            self.send_json(*probe_answer(self.replay, self.read_json()))
        else:
            self.completion(path, self.read_json())

    def not_found(self) -> None:
        self.send_json(404, {"detail": "Not Found"})

    def health(self) -> None:
        self.send_body(200 if self.replay.ready.is_set() else 503, b"", "text/plain")

    def metrics(self) -> None:
        snapshot = self.replay.metrics()
        if snapshot is None or snapshot[0] != 200:
            self.send_body(503, b"", "text/plain")  # the real engine did not answer yet
            return
        self.send_body(200, snapshot[1].encode(), "text/plain; version=0.0.4; charset=utf-8")

    def server_info(self) -> None:
        self.recorded("server_info.json")

    def models(self) -> None:
        self.recorded("models.json")

    def recorded(self, name: str) -> None:
        body = self.replay.recording.json_file(name)
        if body is None:
            self.not_found()
            return
        self.send_json(200, body)

    def model_info(self) -> None:
        info = self.replay.recording.json_file("server_info.json") or {}
        self.send_json(200, {"model_path": info.get("model_path"),
                             "tokenizer_path": info.get("tokenizer_path"),
                             "is_generation": True})

    def completion(self, path: str, body: dict[str, Any]) -> None:
        stream = self.replay.recording.sse(STREAMS[path])
        if stream is None:
            self.not_found()
            return
        head, chunks = stream
        if not body.get("stream"):
            self.send_json(int(head["status"]), assembled(path, chunks))
            return
        self.send_response(int(head["status"]))
        for name, value in head["headers"].items():
            if name.lower() in ("content-type", "vary"):
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        previous = chunks[0][0] if chunks else 0.0
        for at, data in chunks:
            time.sleep(max(0.0, self.replay.play_time_of_gap(at - previous)))
            previous = at
            raw = data.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
