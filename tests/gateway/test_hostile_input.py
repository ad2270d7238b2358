"""Hostile and broken input at the gateway, through the panel's real uvicorn: bodies nested or
sized past the limits, absurd max_tokens, refused calls and the rate limit, ended deployments,
and engines that break a stream off. Each is refused or reported as an OpenAI-shaped error
naming the limit or the state, never a 500, in bounded time. The engines here are loopback
servers that misbehave on purpose (tests/gateway/test_proxy.py has the real test engine)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from django.conf import settings
from openai import OpenAI

from tests.servers import ROOT
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.models import ApiKeyUsage
from web.gateway.proxy import MAX_JSON_DEPTH
from web.gateway.services import apikey_revoke

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "loop", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}


def error_of(response: requests.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}, error
    return dict(error)


# ------------------------------------------------------------------ a loopback engine

class _Engine(ThreadingHTTPServer):
    """An engine on loopback that streams `chunks` events, then ends as `ending` says:
    "done" (as SGLang: [DONE] and the chunked body's end), "die" (the socket shut mid-body,
    no closing chunk: an engine killed), "short" (the body ends cleanly, no [DONE])."""

    def __init__(self, ending: str, chunks: int = 3) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ending, self.chunks = ending, chunks
        self.bodies: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.bodies.append(body)
        if not body.get("stream"):
            data = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}], "usage": {"prompt_tokens": 1,
                                                       "completion_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(self.server.chunks):
            event = {"id": "x", "object": "chat.completion.chunk", "model": "loop",
                     "choices": [{"index": 0, "delta": {"content": f"w{i} "},
                                  "finish_reason": None}]}
            self._chunk(f"data: {json.dumps(event)}\n\n")
        if self.server.ending == "die":
            self._chunk('data: {"id": "x", "object": "chat.compl')  # half an event, then gone
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if self.server.ending == "done":
            self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


@contextmanager
def loop_engine(ending: str = "done", name: str = "loop", **spec_changes: Any,
                ) -> Iterator[tuple[_Engine, Deployment]]:
    engine = _Engine(ending)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    data = spec(name=name, **spec_changes)
    deployment = Deployment.objects.create(
        name=name, spec=data, recipe=data["recipe"], algorithm="DDTREE", gpus=data["gpus"],
        status=DeploymentStatus.READY, engine_url=engine.url)
    try:
        yield engine, deployment
    finally:
        engine.shutdown()
        engine.server_close()


def deep_json(levels: int) -> bytes:
    return b'{"model": "loop", "messages": ' + b"[" * levels + b"]" * levels + b"}"


# ------------------------------------------------------------------ bodies


def test_a_deep_body_is_refused_by_its_key_before_it_is_parsed(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    with loop_engine() as (engine, _):
        secret = key_for(operator)
        assert apikey_revoke(prefix=secret[:14])
        for levels in (5_000, 100_000):
            for headers, status, code in (({}, 401, "missing_api_key"),
                                          (bearer("sk-sd-nothing"), 401, "invalid_api_key"),
                                          (bearer(secret), 403, "key_revoked")):
                started = time.monotonic()
                answer = requests.post(f"{panel}/v1/chat/completions", data=deep_json(levels),
                                       headers=headers, timeout=30)
                assert (answer.status_code, error_of(answer)["code"]) == (status, code)
                assert time.monotonic() - started < 5
        assert engine.bodies == []


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 900, 5_000, 100_000, 500_000])
def test_a_deep_body_with_a_good_key_is_a_400_naming_the_depth_limit(panel, operator, key_for, levels: int) -> None:  # type: ignore[no-untyped-def]
    with loop_engine() as (engine, _):
        secret = key_for(operator)
        for path in ("/v1/chat/completions", "/v1/completions"):
            started = time.monotonic()
            answer = requests.post(f"{panel}{path}", data=deep_json(levels),
                                   headers=bearer(secret), timeout=30)
            assert answer.status_code == 400, answer.text[:300]
            error = error_of(answer)
            assert error["type"] == "invalid_request_error"
            assert f"nested deeper than {MAX_JSON_DEPTH} levels" in error["message"]
            assert time.monotonic() - started < 5
        assert engine.bodies == []


def test_a_wide_body_within_the_limits_is_relayed(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    """Many messages (each a level of its own under `messages`) are no depth at all."""
    with loop_engine() as (engine, _):
        messages = [{"role": "user", "content": [{"type": "text", "text": "x"}]}] * 20_000
        body = {**CHAT, "messages": messages,
                "tools": [{"type": "function", "function": {"name": "f", "parameters":
                          json.loads('{"type": "object", "properties": {"a": ' * 20 + "{}"
                                     + "}}" * 20)}}]}
        answer = requests.post(f"{panel}/v1/chat/completions", json=body,
                               headers=bearer(key_for(operator)), timeout=30)
        assert answer.status_code == 200, answer.text[:300]
        assert len(engine.bodies[0]["messages"]) == 20_000


def test_a_body_over_the_gateways_limit_is_a_413_naming_it(tmp_path: Path, live_channel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    from tests.servers import panel_server
    with loop_engine() as (engine, _), panel_server(
            tmp_path / "uvicorn.log", APPLIANCE_GATEWAY_MAX_BODY_BYTES="100000") as url:
        secret = key_for(operator)
        big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "a" * 100_000}]})
        answer = requests.post(f"{url}/v1/chat/completions", data=big, headers=bearer(secret),
                               timeout=30)
        assert answer.status_code == 413
        error = error_of(answer)
        assert error["code"] == "body_too_large"
        assert "100000 bytes" in error["message"]
        assert "APPLIANCE_GATEWAY_MAX_BODY_BYTES" in error["message"]
        assert engine.bodies == []
        fits = requests.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(secret),
                             timeout=30)
        assert fits.status_code == 200
    assert "Traceback" not in (tmp_path / "uvicorn.log").read_text()


def test_the_readme_and_env_example_state_the_gateways_shipped_body_limit() -> None:
    limit = settings.GATEWAY_MAX_BODY_BYTES
    assert limit % (1024 * 1024) == 0
    mib = f"{limit // (1024 * 1024)} MiB"
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"over {mib}[^.]*APPLIANCE_GATEWAY_MAX_BODY_BYTES", readme), mib
    assert f"#APPLIANCE_GATEWAY_MAX_BODY_BYTES={limit}" in (ROOT / ".env.example").read_text()
    assert "APPLIANCE_GATEWAY_MAX_BODY_BYTES" in (ROOT / "compose.yaml").read_text()


# ------------------------------------------------------------------ max_tokens


def test_max_tokens_past_the_gateways_cap_is_a_400_naming_it(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    with loop_engine() as (engine, _):
        secret = key_for(operator)
        cap = settings.GATEWAY_MAX_TOKENS
        for name in ("max_tokens", "max_completion_tokens"):
            answer = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                                   json={**CHAT, name: 10**12}, timeout=30)
            assert answer.status_code == 400
            error = error_of(answer)
            assert (error["param"], error["code"]) == (name, "invalid_value")
            assert f"`{name}` is 1000000000000" in error["message"]
            assert f"{cap} tokens (APPLIANCE_GATEWAY_MAX_TOKENS" in error["message"]
        for bad in (0, -5, "many", 1.5, True):
            answer = requests.post(f"{panel}/v1/completions", headers=bearer(secret),
                                   json={"model": "loop", "prompt": "x", "max_tokens": bad},
                                   timeout=30)
            assert answer.status_code == 400, bad
            assert "positive whole number" in error_of(answer)["message"]
        assert engine.bodies == []
        fits = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                             json={**CHAT, "max_tokens": cap}, timeout=30)
        assert fits.status_code == 200


def test_max_tokens_past_the_deployments_context_length_is_a_400_naming_it(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    with loop_engine(engine__context_length=4096) as (engine, _):
        answer = requests.post(f"{panel}/v1/chat/completions", headers=bearer(key_for(operator)),
                               json={**CHAT, "max_tokens": 4097}, timeout=30)
        assert answer.status_code == 400
        assert "context length, 4096 tokens (engine.context_length)" in \
            error_of(answer)["message"]
        assert engine.bodies == []


# ------------------------------------------------------------------ refusals and the limit


def test_a_call_refused_out_of_scope_uses_none_of_the_rate_limit(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    with loop_engine(name="mine") as (_, mine), loop_engine(name="theirs"):
        secret = key_for(operator, deployments=[mine], rate_limit_per_minute=2)
        for _ in range(5):
            refused = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                                    json={**CHAT, "model": "theirs"}, timeout=30)
            assert error_of(refused)["code"] == "model_not_allowed"
        for model in ("nobody", "mine"):  # unknown model, and an absurd max_tokens
            requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                          json={**CHAT, "model": model, "max_tokens": 10**12}, timeout=30)
        codes = [requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                               json={**CHAT, "model": "mine"}, timeout=30).status_code
                 for _ in range(3)]
        assert codes == [200, 200, 429]


def test_a_key_scoped_to_the_older_of_two_deployments_of_one_name_reaches_it(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    """Two active deployments of one name (made before the service refused a second): the
    call goes where /v1/models said it would, not to a 403."""
    with loop_engine(name="twin") as (older_engine, older), loop_engine(name="twin") as (
            newer_engine, _):
        secret = key_for(operator, deployments=[older])
        models = requests.get(f"{panel}/v1/models", headers=bearer(secret), timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["twin"]
        answer = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                               json={**CHAT, "model": "twin"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert len(older_engine.bodies) == 1 and newer_engine.bodies == []


# ------------------------------------------------------------------ ended deployments


@pytest.mark.parametrize("status", [DeploymentStatus.FAILED, DeploymentStatus.STOPPED])
def test_a_deployment_that_ended_answers_503_naming_its_status(panel, operator, key_for, status: str) -> None:  # type: ignore[no-untyped-def]
    with loop_engine(name="gone") as (engine, deployment):
        secret = key_for(operator)
        assert requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                             json={**CHAT, "model": "gone"}, timeout=30).status_code == 200
        Deployment.objects.filter(pk=deployment.pk).update(status=status)
        deadline, served = time.monotonic() + 10, 1  # the routing table hears of it at once
        while True:
            answer = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                                   json={**CHAT, "model": "gone"}, timeout=30)
            if answer.status_code != 200 or time.monotonic() > deadline:
                break
            served += 1
            time.sleep(0.1)
        assert answer.status_code == 503
        error = error_of(answer)
        assert error["code"] == "deployment_not_ready"
        assert f"'gone' (#{deployment.pk}) is {status}, not ready" in error["message"]
        assert "restart the deployment" in error["message"]
        never = requests.post(f"{panel}/v1/chat/completions", headers=bearer(secret),
                              json={**CHAT, "model": "never-served"}, timeout=30)
        assert never.status_code == 404
        models = requests.get(f"{panel}/v1/models", headers=bearer(secret), timeout=30).json()
        assert "gone" not in [m["id"] for m in models["data"]]
        assert len(engine.bodies) == served  # the refused calls never reached it


# ------------------------------------------------------------------ broken streams


def _stream(url: str, secret: str) -> list[str]:
    with requests.post(f"{url}/v1/chat/completions", headers=bearer(secret), stream=True,
                       json={**CHAT, "stream": True}, timeout=30) as answer:
        assert answer.status_code == 200
        return [e for e in answer.content.decode().split("\n\n") if e]


@pytest.mark.parametrize("ending", ["die", "short"])
def test_a_stream_the_engine_breaks_off_ends_with_an_error_event_and_done(panel, operator, key_for, ending: str) -> None:  # type: ignore[no-untyped-def]
    with loop_engine(ending) as (_, deployment):
        secret = key_for(operator)
        events = _stream(panel, secret)
        assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:3]] == \
            ["w0 ", "w1 ", "w2 "]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert (error["type"], error["code"]) == ("engine_error", "engine_stream_broken")
        assert "incomplete" in error["message"]
        assert len(events) == 5  # the half event the engine left is not passed on
        # The OpenAI client raises on it, rather than take the short answer as whole.
        client = OpenAI(base_url=f"{panel}/v1", api_key=secret, max_retries=0)
        got: list[str] = []
        with pytest.raises(openai.APIError, match="incomplete"):
            for chunk in client.chat.completions.create(
                    model="loop", messages=[{"role": "user", "content": "hi"}], stream=True):
                got.append(chunk.choices[0].delta.content or "")
        assert got == ["w0 ", "w1 ", "w2 "]
    assert ApiKeyUsage.objects.get(deployment=deployment).requests == 2


def test_a_whole_stream_passes_with_no_error_event(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    with loop_engine("done"):
        events = _stream(panel, key_for(operator))
    assert events[-1] == "data: [DONE]" and len(events) == 4
    assert not any('"error"' in e for e in events)
