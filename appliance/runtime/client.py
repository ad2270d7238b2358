"""A small HTTP client for one SGLang engine (or the test engine): single calls, no loops.

Waiting and deadlines belong to the caller (the deploy task), which also watches the
container for an early exit between calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests


class EngineClientError(RuntimeError):
    """The engine answered with an error, or not at all."""


class EngineClient:
    """Calls to SGLang's HTTP API at base_url (e.g. http://127.0.0.1:32768)."""

    def __init__(self, base_url: str, timeout: float = 10.0, api_key: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        if api_key:  # an engine started with --api-key (a fleet host's): /health needs none
            self._session.headers["Authorization"] = f"Bearer {api_key}"

    def health(self) -> int:
        """/health status code: 503 while starting, 200 when up; 0 when nothing answers."""
        try:
            return self._session.get(self._url("/health"), timeout=self.timeout).status_code
        except requests.RequestException:
            return 0

    def server_info(self) -> dict[str, Any]:
        """/server_info: server args, version, internal_states (avg_spec_accept_length...)."""
        info = self._get("/server_info").json()
        if not isinstance(info, dict):
            raise EngineClientError(f"/server_info answered {type(info).__name__}, not an object")
        return info

    def metrics_text(self) -> str:
        """/metrics Prometheus text (needs --enable-metrics)."""
        return self._get("/metrics").text

    def models(self) -> list[str]:
        """Model ids served (/v1/models)."""
        data = self._get("/v1/models").json().get("data", [])
        return [str(m.get("id")) for m in data]

    def generate_one_token(self, prompt: str = "Hello") -> str:
        """One greedy token through /generate: the readiness probe after /health is 200."""
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        answer = self._post("/generate", body).json()
        return str(answer.get("text", ""))

    def chat_stream(
        self, messages: list[dict[str, str]], max_tokens: int = 64, model: str = "default"
    ) -> Iterator[str]:
        """Stream an OpenAI chat completion; yields the content deltas as they arrive."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True}
        response = self._post("/v1/chat/completions", body, stream=True)
        try:
            yield from _sse_contents(response.iter_lines(decode_unicode=True))
        finally:
            response.close()

    def close(self) -> None:
        self._session.close()

    # ------------------------------------------------------------------ internals

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _get(self, path: str) -> requests.Response:
        return self._request("GET", path)

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
        return self._request("POST", path, json=body, stream=stream)

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self._session.request(method, self._url(path), timeout=self.timeout,
                                             **kwargs)
        except requests.RequestException as exc:
            raise EngineClientError(f"{method} {path} failed: {exc}") from exc
        if response.status_code >= 400:
            detail = response.text[:300]
            response.close()
            raise EngineClientError(f"{method} {path} answered {response.status_code}: {detail}")
        return response


def _sse_contents(lines: Iterator[str]) -> Iterator[str]:
    """Content deltas of OpenAI chat-completion SSE lines, up to `data: [DONE]`."""
    for line in lines:
        if not line or not line.startswith("data:"):
            continue  # blank separators and ": keep-alive" comments
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise EngineClientError(f"bad SSE event from the engine: {payload[:200]}") from exc
        if "error" in event:
            raise EngineClientError(f"engine error while streaming: {event['error']}")
        for choice in event.get("choices", []):
            content = (choice.get("delta") or {}).get("content")
            if content:
                yield str(content)
