"""The gateway through the panel's uvicorn to a real test engine container: who gets in,
what passes, what is counted, and what never reaches the engine."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httptools
import pytest
import requests
from openai import OpenAI

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.conftest_docker import FAST_ENV, TEST_LABELS, host_port, wait_for
from tests.servers import login_session
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.models import ApiKeyUsage
from web.gateway.services import apikey_revoke

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

CHAT = {"model": "chatty", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def post(url: str, path: str, body: dict, headers: dict | None = None, **kw) -> requests.Response:  # type: ignore[no-untyped-def]
    return requests.post(f"{url}{path}", json=body, headers=headers or {}, timeout=30, **kw)


def error_of(response: requests.Response) -> dict:  # type: ignore[type-arg]
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    return error


def events(raw: bytes) -> list[str]:
    return [e for e in raw.decode().split("\n\n") if e]


def text(events: list[str]) -> str:
    """The content the chunks carry, joined."""
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]"]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


class Tap:
    """A TCP relay on loopback between the gateway and an engine that keeps every byte the
    engine sent back: what the engine answered to the very request the gateway relayed
    (a second generation's chunks differ: the test engine sends the steps already due
    together, as a loaded engine does)."""

    def __init__(self, engine_url: str) -> None:
        parts = urlsplit(engine_url)
        self.engine = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.sent: list[bytearray] = []  # per connection, the engine's bytes in order
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            engine = socket.create_connection(self.engine, timeout=30)
            record = bytearray()
            self.sent.append(record)
            for source, sink, kept in ((client, engine, None), (engine, client, record)):
                pump = threading.Thread(target=_pump, args=(source, sink, kept), daemon=True)
                pump.start()
                self._threads.append(pump)

    def answers(self) -> list[bytes]:
        """Each HTTP answer's body as the engine sent it (chunked framing undone), in order."""
        bodies: list[bytes] = []
        for record in self.sent:
            parser = httptools.HttpResponseParser(_Bodies(bodies))
            parser.feed_data(bytes(record))
        return bodies

    def close(self) -> None:
        self.server.close()
        self._accepting.join(5)


class _Bodies:
    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies, self.body = bodies, bytearray()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.bodies.append(bytes(self.body))
        self.body = bytearray()


def _pump(source: socket.socket, sink: socket.socket, kept: bytearray | None) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            if kept is not None:
                kept += data
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tapped(row: Deployment, engine_url: str) -> Iterator[Tap]:
    """The row's engine reached through a Tap (set before the panel reads its table)."""
    tap = Tap(engine_url)
    Deployment.objects.filter(pk=row.pk).update(engine_url=tap.url)
    try:
        yield tap
    finally:
        tap.close()


def test_it_refuses_a_call_without_a_key(panel, engine_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    answer = post(panel, "/v1/chat/completions", CHAT)
    assert answer.status_code == 401
    assert error_of(answer)["code"] == "missing_api_key"
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_it_refuses_a_wrong_key(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    real = key_for(operator)
    for wrong in (real[:-1] + ("A" if real[-1] != "A" else "B"), "sk-sd-nothing", "x" * 500):
        answer = post(panel, "/v1/chat/completions", CHAT, bearer(wrong))
        assert answer.status_code == 401, wrong
        assert error_of(answer)["code"] == "invalid_api_key"


def test_it_refuses_a_key_once_revoked_even_right_after_a_good_call(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    secret = key_for(operator)
    assert post(panel, "/v1/chat/completions", CHAT, bearer(secret)).status_code == 200
    assert apikey_revoke(prefix=secret[:14])
    answer = post(panel, "/v1/chat/completions", CHAT, bearer(secret))
    assert answer.status_code == 403
    assert error_of(answer)["code"] == "key_revoked"


def test_it_refuses_a_deployment_outside_the_keys_scope(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    chatty, _ = engine_for()
    other, _ = engine_for(name="other")
    secret = key_for(operator, deployments=[other])
    answer = post(panel, "/v1/chat/completions", CHAT, bearer(secret))
    assert answer.status_code == 403
    assert error_of(answer)["code"] == "model_not_allowed"
    models = requests.get(f"{panel}/v1/models", headers=bearer(secret), timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["other"]
    assert post(panel, "/v1/chat/completions", {**CHAT, "model": "other"},
                bearer(secret)).status_code == 200


def test_it_answers_404_for_an_unknown_model_and_503_for_one_not_ready(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for(name="loading-one", status=DeploymentStatus.LOADING)
    secret = key_for(operator)
    missing = post(panel, "/v1/chat/completions", {**CHAT, "model": "nobody"}, bearer(secret))
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "model_not_found"
    loading = post(panel, "/v1/chat/completions", {**CHAT, "model": "loading-one"},
                   bearer(secret))
    assert loading.status_code == 503
    assert "loading" in error_of(loading)["message"]


def test_it_names_a_bad_body_field(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    secret = key_for(operator)
    no_model = post(panel, "/v1/chat/completions", {"messages": []}, bearer(secret))
    assert no_model.status_code == 400 and error_of(no_model)["param"] == "model"
    not_json = requests.post(f"{panel}/v1/completions", data=b"{nope", headers=bearer(secret),
                             timeout=10)
    assert not_json.status_code == 400 and "JSON" in error_of(not_json)["message"]


def test_it_limits_a_keys_requests_per_minute(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    secret = key_for(operator, rate_limit_per_minute=2)
    codes = [post(panel, "/v1/chat/completions", CHAT, bearer(secret)).status_code
             for _ in range(2)]
    limited = post(panel, "/v1/chat/completions", CHAT, bearer(secret))
    assert codes == [200, 200]
    assert limited.status_code == 429
    assert error_of(limited)["code"] == "rate_limit_exceeded"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    unlimited = key_for(operator)
    assert post(panel, "/v1/chat/completions", CHAT, bearer(unlimited)).status_code == 200


def test_a_stream_passes_the_engines_chunks_unchanged_and_in_order(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    row, engine = engine_for()
    secret = key_for(operator)
    body = {**CHAT, "stream": True, "max_tokens": 40, "stream_options": {"include_usage": True}}
    with tapped(row, engine) as tap:
        through = post(panel, "/v1/chat/completions", body, bearer(secret), stream=True)
        assert through.status_code == 200
        assert through.headers["Content-Type"].startswith("text/event-stream")
        ours = events(through.raw.read())
    # Event for event, byte for byte, what the engine sent for this very request: none
    # regrouped, dropped, added or reordered.
    [sent] = tap.answers()
    theirs = events(sent)
    assert ours == theirs
    assert len(theirs) >= 6 and ours[-1] == "data: [DONE]"
    assert '"usage"' in ours[-2]  # the usage chunk the client asked for, before [DONE]
    assert len({json.loads(e[6:])["id"] for e in ours[:-1]}) == 1  # one generation's chunks


def test_a_stream_holds_no_usage_chunk_the_client_did_not_ask_for(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    row, engine = engine_for()
    secret = key_for(operator)
    body = {**CHAT, "stream": True, "max_tokens": 12}
    with tapped(row, engine) as tap:
        through = events(post(panel, "/v1/chat/completions", body, bearer(secret)).content)
    [sent] = tap.answers()
    theirs = events(sent)
    # The engine was asked for usage on the client's behalf: its usage-only chunk, and
    # nothing else, is held back; the rest passes as the engine sent it.
    usage = [e for e in theirs if '"usage"' in e and json.loads(e[6:])["choices"] == []]
    assert len(usage) == 1 and json.loads(usage[0][6:])["usage"]["completion_tokens"] == 12
    assert through == [e for e in theirs if e != usage[0]]
    assert len(text(through).split()) == 12
    assert all('"usage"' not in e for e in through)
    stored = ApiKeyUsage.objects.get()
    assert (stored.requests, stored.completion_tokens) == (1, 12)  # asked on the client's behalf


def test_it_counts_the_engines_usage_per_key_and_deployment(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    chatty, engine = engine_for()
    secret = key_for(operator)
    whole = post(panel, "/v1/chat/completions", CHAT, bearer(secret)).json()["usage"]
    post(panel, "/v1/completions", {"model": "chatty", "prompt": "one two three",
                                    "max_tokens": 5}, bearer(secret))
    post(panel, "/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 7},
         bearer(secret))
    usage = ApiKeyUsage.objects.get(deployment=chatty)
    assert usage.requests == 3
    assert usage.completion_tokens == whole["completion_tokens"] + 5 + 7
    assert usage.prompt_tokens == whole["prompt_tokens"] * 2 + 3
    assert usage.key.last_used_at is not None


def test_engine_admin_and_internal_endpoints_are_unreachable(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    _, engine = engine_for()
    secret = key_for(operator)
    assert requests.get(f"{engine}/server_info", timeout=10).status_code == 200  # it has them
    for method, path in [("POST", "/v1/generate"), ("POST", "/generate"),
                         ("POST", "/flush_cache"), ("GET", "/server_info"),
                         ("GET", "/v1/server_info"), ("POST", "/load_lora_adapter_from_tensors"),
                         ("POST", "/v1/load_lora_adapter_from_tensors"), ("GET", "/v1/metrics"),
                         ("GET", "/v1/../server_info"), ("GET", "/v1/models/../../metrics")]:
        answer = requests.request(method, f"{panel}{path}", headers=bearer(secret),
                                  json={"model": "chatty"}, timeout=10)
        # 404/405 from the gateway or Django; /metrics is the panel's own (token: 401)
        assert answer.status_code in (401, 404, 405), (path, answer.status_code)
        assert "max_total_num_tokens" not in answer.text and "sglang:" not in answer.text
    wrong_method = requests.get(f"{panel}/v1/chat/completions", headers=bearer(secret),
                                timeout=10)
    assert wrong_method.status_code == 405


def test_models_lists_each_deployment_by_its_served_model_name(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()  # no served_model_name: the deployment's name
    _, engine = engine_for(name="kimi-ddtree", engine__served_model_name="kimi-chat")
    secret = key_for(operator)
    listed = requests.get(f"{panel}/v1/models", headers=bearer(secret), timeout=10).json()
    assert sorted(m["id"] for m in listed["data"]) == ["chatty", "kimi-chat"]
    # the engine was launched with it, so its own answers name the model the same way
    assert requests.get(f"{engine}/v1/models", timeout=10).json()["data"][0]["id"] == "kimi-chat"
    answer = post(panel, "/v1/chat/completions", {**CHAT, "model": "kimi-chat"}, bearer(secret))
    assert answer.json()["model"] == "kimi-chat"


def test_the_openai_client_streams_through_the_gateway(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    client = OpenAI(base_url=f"{panel}/v1", api_key=key_for(operator))
    assert [m.id for m in client.models.list()] == ["chatty"]
    stream = client.chat.completions.create(
        model="chatty", messages=[{"role": "user", "content": "hi"}], max_tokens=9,
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.split() == ["the", "draft", "tree", "verifies", "tokens", "in", "one",
                            "forward", "pass"]
    with pytest.raises(Exception) as refused:
        OpenAI(base_url=f"{panel}/v1", api_key="sk-sd-wrong").models.list()
    assert getattr(refused.value, "status_code", None) == 401


def test_an_operators_session_may_call_with_its_csrf_token(panel, engine_for, operator) -> None:  # type: ignore[no-untyped-def]
    chatty, _ = engine_for()
    session = login_session(panel, "otto", "operator-pass-1")
    csrf = session.cookies["csrftoken"]
    refused = session.post(f"{panel}/v1/chat/completions", json=CHAT, timeout=10)
    assert refused.status_code == 403 and error_of(refused)["code"] == "csrf_failed"
    answer = session.post(f"{panel}/v1/chat/completions", json=CHAT, timeout=30,
                          headers={"X-CSRFToken": csrf, "Referer": f"{panel}/"})
    assert answer.status_code == 200
    usage = ApiKeyUsage.objects.get(deployment=chatty)
    assert usage.key is None and usage.user == operator and usage.requests == 1


def test_a_viewers_session_may_not_call(panel, engine_for, viewer) -> None:  # type: ignore[no-untyped-def]
    engine_for()
    session = login_session(panel, "vera", "viewer-pass-1")
    answer = session.post(f"{panel}/v1/chat/completions", json=CHAT, timeout=10, headers={
        "X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{panel}/"})
    assert answer.status_code == 403 and error_of(answer)["code"] == "role_required"


def test_a_stream_is_counted_by_the_time_its_client_reads_done(panel, engine_for, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    chatty, _ = engine_for()
    secret = key_for(operator)
    with post(panel, "/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 5},
              bearer(secret), stream=True) as answer:
        for line in answer.iter_lines():
            if line == b"data: [DONE]":
                break  # and look at once, without reading the response's end
        usage = ApiKeyUsage.objects.get(deployment=chatty)
    assert (usage.requests, usage.completion_tokens) == (1, 5)


class _SlowEngine(ThreadingHTTPServer):
    """An engine on loopback that streams a chunk every 20 ms for 10 s and notes when its
    client (the gateway) goes away: what a client that disconnects should stop."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SlowHandler)
        self.chunks_written = 0
        self.client_gone = threading.Event()


class _SlowHandler(BaseHTTPRequestHandler):
    server: _SlowEngine
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = {"id": "slow", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
        data = f"data: {json.dumps(chunk)}\n\n".encode()
        try:
            for _ in range(500):
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                self.server.chunks_written += 1
                time.sleep(0.02)
        except OSError:
            self.server.client_gone.set()


def test_a_client_that_goes_away_stops_the_engines_stream(panel, operator, key_for) -> None:  # type: ignore[no-untyped-def]
    engine = _SlowEngine()
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        data = spec(name="slowpoke")
        Deployment.objects.create(
            name="slowpoke", spec=data, recipe=data["recipe"], algorithm="DDTREE",
            gpus=data["gpus"], status=DeploymentStatus.READY,
            engine_url=f"http://127.0.0.1:{engine.server_address[1]}")
        secret = key_for(operator)
        with post(panel, "/v1/chat/completions", {**CHAT, "model": "slowpoke", "stream": True},
                  bearer(secret), stream=True) as answer:
            assert answer.status_code == 200
            first = next(answer.iter_lines())
            assert first.startswith(b"data: ")
        # The response closed after its first event: the gateway drops the engine's stream,
        # long before the engine's 500 chunks (10 s) are written.
        assert engine.client_gone.wait(5), "the engine's stream went on after the client left"
        assert engine.chunks_written < 250
    finally:
        engine.shutdown()
        engine.server_close()


def test_a_stream_whose_engine_container_is_killed_ends_with_an_error_event(panel, operator, key_for, docker_client, test_engine_image) -> None:  # type: ignore[no-untyped-def]
    """A real test engine, killed (SIGKILL, as an OOM kill or a crash) in mid-answer: the
    client's stream ends with the gateway's error event and [DONE], promptly."""
    data = spec(name="doomed")
    container = docker_client.containers.run(
        test_engine_image, command=launch_args(spec_from_dict(data)).argv, detach=True,
        environment=dict(FAST_ENV), labels=dict(TEST_LABELS),
        ports={"30000/tcp": ("127.0.0.1", None)})
    try:
        url = f"http://127.0.0.1:{host_port(container)}"
        wait_for(lambda: _up(url), timeout_s=90)
        Deployment.objects.create(name="doomed", spec=data, recipe=data["recipe"],
                                  algorithm="DDTREE", gpus=data["gpus"],
                                  status=DeploymentStatus.READY, engine_url=url)
        body = {**CHAT, "model": "doomed", "stream": True, "max_tokens": 200_000}
        with post(panel, "/v1/chat/completions", body, bearer(key_for(operator)),
                  stream=True) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()
            assert next(lines).startswith(b"data: ")
            container.kill()
            started = time.monotonic()
            rest = [line for line in lines if line]
        assert time.monotonic() - started < 15
        assert rest[-1] == b"data: [DONE]"
        error = json.loads(rest[-2].removeprefix(b"data: "))["error"]
        assert error["code"] == "engine_stream_broken"
    finally:
        container.remove(force=True)


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False
