"""EngineClient against the test engine in a real container."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from docker.models.containers import Container

from appliance.runtime.client import EngineClient, EngineClientError, _sse_contents
from tests.conftest_docker import (  # noqa: F401 (fixtures)
    docker_client,
    host_port,
    run_test_engine,
    test_engine_image,
    wait_for,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ready_client(run: Callable[..., Container], env: dict[str, str] | None = None) -> EngineClient:
    container = run(env=env)
    client = EngineClient(f"http://127.0.0.1:{host_port(container)}", timeout=10)
    wait_for(lambda: client.health() == 200, 30)
    return client


def test_health_is_zero_when_nothing_listens() -> None:
    assert EngineClient(f"http://127.0.0.1:{free_port()}", timeout=1).health() == 0


def test_sse_parsing_keeps_content_deltas_and_stops_at_done() -> None:
    lines = iter([
        ": keep-alive",
        'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
        "",
        'data: {"choices": [{"delta": {"content": "Hel"}}]}',
        'data: {"choices": [{"delta": {"content": "lo"}, "finish_reason": null}]}',
        "data: [DONE]",
        'data: {"choices": [{"delta": {"content": "after done"}}]}',
    ])
    assert list(_sse_contents(lines)) == ["Hel", "lo"]


def test_an_sse_error_event_raises() -> None:
    with pytest.raises(EngineClientError, match="boom"):
        list(_sse_contents(iter(['data: {"error": {"message": "boom"}}'])))


@pytest.mark.docker
def test_health_is_503_while_loading(run_test_engine) -> None:  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_FAIL": "hang-load"})
    client = EngineClient(f"http://127.0.0.1:{host_port(container)}", timeout=5)
    wait_for(lambda: client.health() == 503, 30)
    with pytest.raises(EngineClientError, match="503"):
        client.generate_one_token()


@pytest.mark.docker
def test_a_ready_engine_answers_every_call(run_test_engine) -> None:  # noqa: F811
    client = ready_client(run_test_engine)
    assert client.generate_one_token().strip()
    info = client.server_info()
    assert info["speculative_algorithm"] == "DDTREE"
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1
    assert "sglang:num_running_reqs" in client.metrics_text()
    assert client.models() == ["/models/kimi-k2.6"]
    pieces = list(client.chat_stream([{"role": "user", "content": "hi"}], max_tokens=24))
    assert len(pieces) >= 2
    assert len("".join(pieces).split()) == 24


@pytest.mark.docker
def test_a_crashing_engine_raises_a_client_error(run_test_engine) -> None:  # noqa: F811
    client = ready_client(run_test_engine, env={"TEST_ENGINE_FAIL": "ddtree-width"})
    with pytest.raises(EngineClientError, match="/generate failed"):
        client.generate_one_token()
    wait_for(lambda: client.health() == 0, 10)
