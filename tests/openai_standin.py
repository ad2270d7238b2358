"""A stand-in OpenAI-compatible server that is not SGLang: only GET /v1/models, POST
/v1/completions and POST /v1/chat/completions, with `logprobs` in OpenAI's shapes
(completions: `tokens`, `token_logprobs`, `top_logprobs` as {text: logprob}; chat:
`content[]` of {token, logprob, bytes, top_logprobs}). No /generate, no /model_info.

Its model is a fixed function of the prompt: at each position a top TOP_K of words with the
top two GAP apart, except at the positions in `near_ties` (NEAR_TIE apart). A server made with
`diverge_at=k` takes the model's second choice at token k and goes on from that other token,
as a speculative server whose verify changed the output would. `logprobs=False` answers a
request for log-probs as SGLang's speculative servers do on /v1 (433c58ed7: a 400 naming
return_logprob); `api_key` makes it want that bearer key; `strict` refuses fields OpenAI does
not define (`ignore_eos`) with a 400, as OpenAI's own API does. `stream: true` is answered
with one event per token (and the usage chunk `stream_options.include_usage` asks for), then
[DONE]. A test may set `fail_with` (every request answered with that status, as an engine
going away answers 503) `cut_after` (a stream's connection dropped after that many token
events, as an engine killed mid-answer) or `pace_s` (a wait between events) on the StandIn
while it runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Words, some the start of another (" tree" / " tr"), so a text can be split two ways.
VOCAB = (" the", " draft", " tree", " tr", " ee", " verifies", " tokens", " in", " one",
         " pass", " and", " accepts", " a", " longer", " prefix", " so", " decoding", " runs",
         " faster", "\n", ",", ".")
TOP_K = 8
GAP, NEAR_TIE = 2.0, 0.0625
MODEL = "standin-model"
# SGLang 433c58ed7's answer on /v1 to logprobs on a DFLASH/DDTREE server (serving_base's
# create_error_response of the scheduler's abort message).
REFUSAL = {"object": "error", "message": "DFLASH speculative decoding does not support "
           "return_logprob yet.", "type": "BadRequestError", "param": None, "code": 400}
KNOWN = {"model", "prompt", "messages", "max_tokens", "temperature", "logprobs",
         "top_logprobs", "stream", "n", "stop", "stream_options"}


def top(seed: str, position: int, near_ties: frozenset[int]) -> list[tuple[str, float]]:
    h = hashlib.sha256(f"{seed}\0{position}".encode()).digest()
    first = h[0] % len(VOCAB)
    order = [VOCAB[(first + k * (1 + h[1] % 5)) % len(VOCAB)] for k in range(len(VOCAB))]
    words = list(dict.fromkeys(order))[:TOP_K]
    if len(words) < TOP_K:
        words += [w for w in VOCAB if w not in words][:TOP_K - len(words)]
    gap = NEAR_TIE if position in near_ties else GAP
    top1 = -(h[2] % 32) / 64
    return [(w, top1 - (gap if i else 0.0) - 0.5 * max(i - 1, 0)) for i, w in enumerate(words)]


def answer_steps(prompt: str, count: int, near_ties: frozenset[int],
                 diverge_at: int | None) -> list[tuple[str, list[tuple[str, float]]]]:
    """(token, the model's top there) for each position."""
    seed, out = prompt, []
    for position in range(count):
        best = top(seed, position, near_ties)
        token = best[0][0]
        if position == diverge_at:
            token = best[1][0]
            seed = f"{prompt}\0took {token!r} at {position}"
        out.append((token, best))
    return out


@dataclass
class StandIn:
    url: str
    seen: list[dict[str, Any]] = field(default_factory=list)  # request bodies, in order
    auth: list[str] = field(default_factory=list)  # each request's Authorization header
    fail_with: int | None = None
    cut_after: int | None = None
    pace_s: float = 0.0  # a stream's wait between token events (a decode step)


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


def app_for(served: StandIn, *, near_ties: frozenset[int], diverge_at: int | None,
            logprobs: bool, api_key: str, strict: bool, model: str) -> web.Application:
    def refused(request: web.Request) -> web.Response | None:
        served.auth.append(request.headers.get("Authorization", ""))
        if api_key and request.headers.get("Authorization") != f"Bearer {api_key}":
            return _error(401, "Invalid API key", "invalid_request_error")
        return None

    async def models(request: web.Request) -> web.Response:
        return refused(request) or web.json_response({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "standin"}]})

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        no = refused(request)
        if no is not None:
            return no
        body = await request.json()
        served.seen.append(body)
        if served.fail_with is not None:
            return _error(served.fail_with, "the engine is going away", "service_unavailable")
        if strict and set(body) - KNOWN:
            unknown = sorted(set(body) - KNOWN)[0]
            return _error(400, f"Unrecognized request argument supplied: {unknown}",
                          "invalid_request_error")
        if body.get("model") != model:
            return _error(404, f"The model {body.get('model')!r} does not exist",
                          "invalid_request_error")
        wants = bool(body.get("logprobs"))
        if wants and not logprobs:
            return web.json_response(REFUSAL, status=400)
        prompt = json.dumps(body["messages"]) if chat else str(body["prompt"])
        steps = answer_steps(prompt, int(body.get("max_tokens") or 16), near_ties,
                             diverge_at)
        if body.get("stream"):
            return await _stream(request, served, steps, body, chat, model)
        text = "".join(t for t, _ in steps)
        n = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length",
                                  "logprobs": _logprobs(steps, n, chat) if wants else None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response({"id": "cmpl-standin", "object": "chat.completion" if chat
                                  else "text_completion", "created": 0, "model": model,
                                  "choices": [choice], "usage": {
                                      "prompt_tokens": 4, "completion_tokens": len(steps),
                                      "total_tokens": 4 + len(steps)}})

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=served.fail_with or 200)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _stream(request: web.Request, served: StandIn,
                  steps: list[tuple[str, list[tuple[str, float]]]], body: dict[str, Any],
                  chat: bool, model: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    kind = "chat.completion.chunk" if chat else "text_completion"

    async def event(data: Any) -> None:
        await response.write(f"data: {json.dumps(data)}\n\n".encode())

    for i, (token, _) in enumerate(steps):
        if served.cut_after is not None and i >= served.cut_after:
            assert request.transport is not None
            request.transport.close()  # as a killed engine: no end, no [DONE]
            return response
        choice = ({"index": 0, "delta": {"content": token}, "finish_reason": None} if chat
                  else {"index": 0, "text": token, "finish_reason": None})
        await event({"id": "cmpl-standin", "object": kind, "model": model, "choices": [choice]})
        if served.pace_s:
            await asyncio.sleep(served.pace_s)
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        await event({"id": "cmpl-standin", "object": kind, "model": model, "choices": [],
                     "usage": {"prompt_tokens": 4, "completion_tokens": len(steps),
                               "total_tokens": 4 + len(steps)}})
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _logprobs(steps: list[tuple[str, list[tuple[str, float]]]], n: int,
              chat: bool) -> dict[str, Any]:
    def own(token: str, best: list[tuple[str, float]]) -> float:
        return next(lp for t, lp in best if t == token)

    if chat:
        return {"content": [{"token": t, "logprob": own(t, best),
                             "bytes": list(t.encode()),
                             "top_logprobs": [{"token": w, "logprob": lp,
                                               "bytes": list(w.encode())}
                                              for w, lp in best[:n]]}
                            for t, best in steps]}
    return {"tokens": [t for t, _ in steps],
            "token_logprobs": [own(t, best) for t, best in steps],
            # OpenAI's order is not promised: the last first, so a reader must sort.
            "top_logprobs": [dict(reversed(best[:n])) for _, best in steps],
            "text_offset": []}


@contextmanager
def standin(*, near_ties: frozenset[int] = frozenset(), diverge_at: int | None = None,
            logprobs: bool = True, api_key: str = "", strict: bool = False,
            model: str = MODEL) -> Iterator[StandIn]:
    """The server on a loopback port, in a thread of its own, for the block."""
    sock = socket.create_server(("127.0.0.1", 0))
    served = StandIn(f"http://127.0.0.1:{sock.getsockname()[1]}")
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app_for(served, near_ties=near_ties, diverge_at=diverge_at,
                                   logprobs=logprobs, api_key=api_key, strict=strict,
                                   model=model))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()
