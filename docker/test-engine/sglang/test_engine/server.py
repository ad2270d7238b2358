"""The HTTP server: SGLang's endpoints (health, info, metrics, OpenAI chat, /generate).

A whole (not streamed) /v1 answer is the simulated model's text (logits.py), with its
log-probs when asked, as /generate's is; a stream's pieces are the pacing's words."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from sglang import __version__
from sglang.test_engine import engine, generate_api
from sglang.test_engine.batching import Ticket
from sglang.test_engine.config import server_args_dict
from sglang.test_engine.engine import MAX_TOKENS_POOL, STATE
from sglang.test_engine.generation import generate
from sglang.test_engine.loglines import access_line
from sglang.test_engine.metrics import metrics_text


def secrets_seen() -> dict[str, str]:
    """Test engine only: the SHA-256 of each secret the entrypoint set (never a value), so
    a test can tell the engine got the right value without the value leaving it."""
    names = [n for n in os.environ.get("APPLIANCE_SECRET_NAMES", "").split(",") if n]
    return {n: hashlib.sha256(os.environ.get(n, "").encode()).hexdigest() for n in names}


def ticket_for(messages: Any) -> Ticket:
    """The prompt's tokens: its words (a chat's messages as JSON)."""
    text = json.dumps(messages) if not isinstance(messages, str) else messages
    return Ticket(text.split())


def usage(ticket: Ticket, completion_tokens: int) -> dict[str, Any]:
    """As SGLang's UsageProcessor: `prompt_tokens_details` is `{"cached_tokens": N}` only
    with --enable-cache-report and N > 0, else null (the recordings' streams, run without
    the flag, all have null)."""
    details = ({"cached_tokens": ticket.cached}
               if engine.CFG.args.enable_cache_report and ticket.cached > 0 else None)
    return {"prompt_tokens": ticket.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": ticket.prompt_tokens + completion_tokens,
            "prompt_tokens_details": details}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        # As uvicorn (SGLang's server) does: a stream's small writes go out at once, not held
        # by Nagle until the client's delayed ACK (40 ms on a kept-alive connection).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return  # access lines are written in uvicorn's format by respond()

    def log_access(self, status: int) -> None:
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        access_line(self.command, self.path, status, client)

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.log_access(status)

    def send_text(self, status: int, text: str, ctype: str = "text/plain") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.log_access(status)

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def unauthorized(self, path: str) -> bool:
        """SGLang's --api-key (433c58ed7's utils/auth.py): every endpoint but /health* and
        /metrics wants `Authorization: Bearer <key>`, else 401."""
        key = engine.CFG.args.api_key
        if not key or path.startswith(("/health", "/metrics")):
            return False
        if hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {key}"):
            return False
        self.send_json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if self.unauthorized(path):
            return
        routes = {
            "/health": self.health,
            "/health_generate": self.health_generate,
            "/v1/models": self.models,
            "/server_info": self.server_info,
            "/get_server_info": self.server_info,
            "/model_info": self.model_info,
            "/get_model_info": self.model_info,
            "/metrics": self.metrics,
        }
        routes.get(path, self.not_found)()

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if self.unauthorized(path):
            return
        routes = {"/v1/chat/completions": self.chat, "/v1/completions": self.completion,
                  "/generate": self.generate}
        routes.get(path, self.not_found)()

    def not_found(self) -> None:
        self.send_json(404, {"detail": "Not Found"})

    def not_ready(self) -> bool:
        if STATE.ready:
            return False
        self.send_text(503, "")
        return True

    def health(self) -> None:
        self.send_text(200 if STATE.ready else 503, "")

    def health_generate(self) -> None:
        if self.not_ready():
            return
        "".join(generate(engine.CFG, Ticket(["health"]), 1))
        self.send_text(200, "")

    def models(self) -> None:
        self.send_json(200, {"object": "list", "data": [{
            "id": engine.CFG.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": engine.CFG.model_name,
            "max_model_len": engine.CFG.context_len}]})

    def model_info(self) -> None:
        self.send_json(200, {"model_path": engine.CFG.args.model_path, "tokenizer_path":
                             engine.CFG.args.model_path, "is_generation": True})

    def server_info(self) -> None:
        state: dict[str, Any] = {"last_gen_throughput": STATE.last_gen_throughput,
                                 "memory_usage": {"weight": 74.34, "kvcache": 35.12,
                                                  "graph": 1.10}}
        if engine.CFG.speculative:
            state["avg_spec_accept_length"] = STATE.avg_accept
        # Not SGLang's: the recordings the simulator's figures replay (profile.py).
        simulated = engine.PROFILES.to_dict() if engine.PROFILES is not None else None
        self.send_json(200, {**server_args_dict(engine.CFG), "version": __version__,
                             "max_total_num_tokens": MAX_TOKENS_POOL,
                             "internal_states": [state], "secrets_seen": secrets_seen(),
                             "simulator_replays": simulated,
                             # Not SGLang's either: the build whose refusals it imitates.
                             "simulator_refusals": engine.REFUSALS.to_dict()
                             if engine.REFUSALS is not None else None})

    def metrics(self) -> None:
        if not engine.CFG.args.enable_metrics:
            self.not_found()
            return
        self.send_text(200, metrics_text(), "text/plain; version=0.0.4; charset=utf-8")

    def chat(self) -> None:
        if self.not_ready():
            return
        body = self.read_json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self.send_json(400, {"object": "error", "message": "messages is required",
                                 "type": "BadRequestError", "code": 400})
            return
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if self.refused(body, chat=True):
            return
        ticket = ticket_for(messages)
        pieces = generate(engine.CFG, ticket, max_tokens)
        rid = uuid.uuid4().hex
        if body.get("stream"):
            self.stream_chat(rid, pieces, ticket, max_tokens, body)
            return
        for _ in pieces:
            pass  # the decode steps' time and counters; the text is the model's
        text, logprobs = generate_api.openai_answer(json.dumps(messages), max_tokens, body,
                                                    chat=True)
        self.send_json(200, {
            "id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": engine.CFG.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": logprobs, "finish_reason": "length"}],
            "usage": usage(ticket, max_tokens)})

    def refused(self, body: dict[str, Any], *, chat: bool) -> bool:
        """The imitated build's recorded answer to a request it cannot serve."""
        refusal = generate_api.openai_refusal(body, chat=chat)
        if refusal is None:
            return False
        status, answer = refusal
        if isinstance(answer, str):  # a stream's error event and [DONE]
            self.start_stream()
            self.write_chunk(answer)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_json(status, answer)
        return True

    def stream_chat(self, rid: str, pieces: Iterator[str], ticket: Ticket,
                    max_tokens: int, body: dict[str, Any]) -> None:
        self.start_stream()

        def chunk(delta: dict[str, Any], finish: str | None) -> None:
            event = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": engine.CFG.model_name,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}]}
            self.write_chunk(f"data: {json.dumps(event)}\n\n")

        for i, piece in enumerate(pieces):
            if i == 0:  # as SGLang: the role comes with the first output, after the prefill
                chunk({"role": "assistant", "content": ""}, None)
            chunk({"content": piece}, None)
        chunk({}, "length")
        self.end_stream(rid, "chat.completion.chunk", ticket, max_tokens, body)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.log_access(200)

    def end_stream(self, rid: str, obj: str, ticket: Ticket, completion_tokens: int,
                   body: dict[str, Any]) -> None:
        """As SGLang: with stream_options.include_usage, a last chunk with no choices and
        the usage, before [DONE]."""
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            event = {"id": rid, "object": obj, "created": int(time.time()),
                     "model": engine.CFG.model_name, "choices": [],
                     "usage": usage(ticket, completion_tokens)}
            self.write_chunk(f"data: {json.dumps(event)}\n\n")
        self.write_chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def completion(self) -> None:
        """/v1/completions: a prompt in, text out, streamed or whole, with usage."""
        if self.not_ready():
            return
        body = self.read_json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            self.send_json(400, {"object": "error", "message": "prompt is required",
                                 "type": "BadRequestError", "code": 400})
            return
        max_tokens = int(body.get("max_tokens") or 16)
        if self.refused(body, chat=False):
            return
        ticket = ticket_for(prompt)
        pieces = generate(engine.CFG, ticket, max_tokens)
        rid = uuid.uuid4().hex

        def choice(text: str, finish: str | None,
                   logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

        if not body.get("stream"):
            for _ in pieces:
                pass  # the decode steps' time and counters; the text is the model's
            text, logprobs = generate_api.openai_answer(prompt, max_tokens, body, chat=False)
            self.send_json(200, {
                "id": rid, "object": "text_completion", "created": int(time.time()),
                "model": engine.CFG.model_name, "choices": [choice(text, "length", logprobs)],
                "usage": usage(ticket, max_tokens)})
            return
        self.start_stream()
        for piece in pieces:
            event = {"id": rid, "object": "text_completion", "created": int(time.time()),
                     "model": engine.CFG.model_name, "choices": [choice(piece, None)]}
            self.write_chunk(f"data: {json.dumps(event)}\n\n")
        self.end_stream(rid, "text_completion", ticket, max_tokens, body)

    def write_chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def generate(self) -> None:
        if self.not_ready():
            return
        body = self.read_json()
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_new_tokens") or 16)
        refusal = generate_api.generate_refused(body)
        if refusal is not None:
            self.send_json(400, refusal)
            return
        prompt = body.get("text") or body.get("input_ids") or ""
        ticket = ticket_for(prompt if isinstance(prompt, str) else " ".join(map(str, prompt)))
        start = time.perf_counter()
        for _ in generate(engine.CFG, ticket, max_tokens):
            pass  # the decode steps' time and counters; the tokens are the model's
        self.send_json(200, generate_api.answer(
            body, max_tokens=max_tokens, prompt_tokens=ticket.prompt_tokens,
            cached_tokens=ticket.cached, latency_s=time.perf_counter() - start))
