"""One streamed request, timed as sglang.bench_serving times it, and /server_info."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from appliance.bench.prompts import Prompt

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass
class RequestResult:
    """Times in seconds from the request's send (time.perf_counter)."""

    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gap between chunks carrying text
    output_len: int = 0
    input_len: int = 0
    token_source: str = "requested"  # usage | requested | chunks
    accept_len: float | None = None  # from per-request meta_info, where the server sends it
    text: str = ""  # the chunks' text (or chat deltas' content / reasoning_content), joined


def payload(endpoint: str, model: str, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "max_tokens": prompt.output_len, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == COMPLETIONS:
        body["prompt"] = prompt.text
    else:
        body["messages"] = [{"role": "user", "content": prompt.text}]
    return body


def _chunk_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or "")


class _Stream:
    """What the chunks of one response add up to."""

    def __init__(self, start: float) -> None:
        self.start, self.last = start, start
        self.ttft, self.chunks = 0.0, 0
        self.itl: list[float] = []
        self.usage: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.finish = ""
        self.texts: list[str] = []

    def feed(self, data: dict[str, Any], now: float) -> None:
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        meta = data.get("meta_info") or (data.get("choices") or [{}])[0].get("meta_info")
        if isinstance(meta, dict):
            self.meta = meta
        for choice in data.get("choices") or []:
            self.finish = choice.get("finish_reason") or self.finish
        text = _chunk_text(data)
        if not text:
            return
        self.texts.append(text)
        if self.chunks == 0:
            self.ttft = now - self.start
        else:
            self.itl.append(now - self.last)
        self.last, self.chunks = now, self.chunks + 1


def _finish(stream: _Stream, prompt: Prompt, result: RequestResult) -> None:
    usage = stream.usage
    if isinstance(usage.get("completion_tokens"), int):
        result.output_len, result.token_source = usage["completion_tokens"], "usage"
    elif stream.finish == "length":
        result.output_len, result.token_source = prompt.output_len, "requested"
    else:
        result.output_len, result.token_source = stream.chunks, "chunks"
    result.input_len = usage.get("prompt_tokens") or prompt.input_len
    verify = stream.meta.get("spec_verify_ct")
    if isinstance(verify, int) and verify > 0:
        result.accept_len = stream.meta.get("completion_tokens", result.output_len) / verify
    result.ttft, result.itl, result.text = stream.ttft, stream.itl, "".join(stream.texts)
    result.ok = stream.chunks > 0
    result.error = "" if result.ok else "the response carried no text"


async def send(session: aiohttp.ClientSession, url: str, endpoint: str, model: str,
               prompt: Prompt, api_key: str = "") -> RequestResult:
    result = RequestResult()
    start = time.perf_counter()
    stream = _Stream(start)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with session.post(url + endpoint, json=payload(endpoint, model, prompt),
                                headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                body = line[5:].strip()
                if body == b"[DONE]":
                    break
                stream.feed(json.loads(body), time.perf_counter())
        result.latency = time.perf_counter() - start
        _finish(stream, prompt, result)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with session.get(url) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def server_accept_len(session: aiohttp.ClientSession, url: str) -> float | None:
    """SGLang's `internal_states[0].avg_spec_accept_length`, as bench_serving reads it."""
    info = await get_json(session, url + "/server_info") or await get_json(
        session, url + "/get_server_info")
    states = (info or {}).get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if isinstance(value, int | float) else None


class Unreachable(Exception):
    """Nothing answers at the target's URL (DNS, refused, timed out): no request can run."""


async def reach(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    """Raise Unreachable when no HTTP server answers at url; any HTTP answer will do (the
    requests themselves report HTTP errors per request)."""
    try:
        async with session.get(url + "/v1/models",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}"[:300]) from exc


async def model_name(session: aiohttp.ClientSession, url: str) -> str:
    data = await get_json(session, url + "/v1/models") or {}
    models = data.get("data") or []
    return str(models[0].get("id", "default")) if models and isinstance(models[0], dict) \
        else "default"
