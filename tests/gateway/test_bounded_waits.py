"""Every request the gateway relays has a bounded wait (docs/gateway.md, "Bounded waits"),
against real test-engine containers (docker/test-engine) as the product launches them, through
the panel's uvicorn, real PostgreSQL and Redis: a paused engine container (its kernel takes the
request, nothing answers), a hung engine process (TEST_ENGINE_FAIL=hang-serve: its HTTP server
answers /health while its scheduler makes nothing) and a paused host (a simulated host of the
fleet's tests, its own Docker and engine inside, frozen whole). Each checks that no request
waits past the stated bound, that a request not yet answered is answered by another replica,
and that a stream cut midway ends with an OpenAI-shaped error event and [DONE]."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.conftest_docker import (  # noqa: F401
    FAST_ENV,
    TEST_LABELS,
    docker_client,
    test_engine_image,
    wait_for,
)
from tests.fleet.simhosts import gateway as network_gateway
from tests.fleet.simhosts import host_networks, sim_host_image, sim_hosts
from tests.servers import panel_server
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.fleet import services as fleet
from web.gateway.bounds import PROBE_TIMEOUT_S

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

MODEL = "bounded-model"
FIRST_BYTE_S = 2  # the panel's APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S here
IDLE_S = 2  # ... APPLIANCE_GATEWAY_IDLE_STREAM_TIMEOUT_S
WHOLE_S = 5  # ... APPLIANCE_GATEWAY_WHOLE_ANSWER_TIMEOUT_S
SLACK_S = 1.5  # the other replica's answer, and this busy machine's scheduling
NO_AFFINITY = [{"type": "text", "text": "no affinity"}]  # content parts: picks go round


BOUNDS = {"APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S": str(FIRST_BYTE_S),
          "APPLIANCE_GATEWAY_IDLE_STREAM_TIMEOUT_S": str(IDLE_S),
          "APPLIANCE_GATEWAY_WHOLE_ANSWER_TIMEOUT_S": str(WHOLE_S)}


@pytest.fixture
def gateway(tmp_path: Path, live_channel) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log", **BOUNDS) as url:
        yield url


@contextlib.contextmanager
def engines(client: Any, image: str, *envs: dict[str, str],
            model: str = MODEL) -> Iterator[tuple[list[Any], list[str]]]:
    """Test engines as the product launches them, each reached at its own address on the
    bridge (as a host's engine is); (containers, URLs) once every /health answers."""
    argv = launch_argv(model)
    containers = [client.containers.run(image, command=argv, detach=True,
                                        environment={**FAST_ENV, **env},
                                        labels=dict(TEST_LABELS)) for env in envs]
    try:
        urls = []
        for container in containers:
            container.reload()
            address = container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
            urls.append(f"http://{address}:30000")
        for url in urls:
            wait_for(lambda url=url: _healthy(url), timeout_s=90)
        yield containers, urls
    finally:
        for container in containers:
            with contextlib.suppress(Exception):
                container.unpause()
            container.remove(force=True)


def launch_argv(model: str = MODEL) -> list[str]:
    return launch_args(spec_from_dict(spec(name="bounded",
                                           engine__served_model_name=model))).argv


def replicas(name: str, urls: list[str], served: str = MODEL) -> list[Deployment]:
    data = spec(name=name, engine__served_model_name=served)
    rows: list[Deployment] = []
    for i, url in enumerate(urls):
        rows.append(Deployment.objects.create(
            name=name, spec=data, recipe=data["recipe"], algorithm="NONE", gpus=data["gpus"],
            status=DeploymentStatus.READY, engine_url=url,
            replica_of=rows[0] if rows else None, replica_index=i))
    return rows


@contextlib.contextmanager
def timed(url: str, secret: str, *, stream: bool, model: str = MODEL, max_tokens: int = 4,
          content: Any = None) -> Iterator[tuple[requests.Response, list[bytes], list[float]]]:
    """A call and, once the block ends, its non-empty lines (read here unless the block read
    them) and [seconds it took]."""
    body = {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": content or NO_AFFINITY}]}
    started = time.monotonic()
    answer = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60, stream=stream,
                           headers={"Authorization": f"Bearer {secret}"})
    lines: list[bytes] = []
    took: list[float] = []
    try:
        yield answer, lines, took
    finally:
        if not lines:
            lines.extend(line for line in answer.iter_lines() if line)
        took.append(time.monotonic() - started)
        answer.close()


def call(url: str, secret: str, *, stream: bool, model: str = MODEL,
         max_tokens: int = 4) -> tuple[requests.Response, list[bytes], float]:
    with timed(url, secret, stream=stream, model=model, max_tokens=max_tokens) as (
            answer, lines, took):
        pass
    return answer, lines, took[0]


def whole_stream(lines: list[bytes]) -> bool:
    return lines[-1] == b"data: [DONE]" and not any(b'"error"' in line for line in lines)


def error_event(lines: list[bytes]) -> dict[str, Any]:
    """The stream's end as the gateway writes a broken one: an error event, then [DONE]."""
    assert lines[-1] == b"data: [DONE]", lines[-3:]
    error = json.loads(lines[-2].removeprefix(b"data: "))["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    return dict(error)


def retried_once_elsewhere(answers: list[tuple[requests.Response, list[bytes], float]],
                           served_by: str, bound_s: float) -> None:
    for answer, lines, took in answers:
        assert answer.status_code == 200, (answer.status_code, lines)
        assert answer.headers["x-appliance-replica"] == served_by
        assert took < bound_s, f"a request waited {took:.1f} s, past {bound_s} s"
        if answer.headers["content-type"].startswith("text/event-stream"):
            assert whole_stream(lines), lines[-3:]
    retried = [a for a, _, _ in answers if a.headers.get("x-appliance-retried")]
    # The frozen replica got one request (answered by the other), then none: out of rotation.
    assert len(retried) == 1, [a.headers for a, _, _ in answers]


def frozen_replica(gateway: str, secret: str, what: str, freeze: Any, thaw: Any,
                   victim: int | None = None) -> None:
    """Two replicas, one frozen (`freeze(index)`, `thaw(index)`): first a stream under way
    on it (ends with the error event within the idle bound), then requests not yet answered
    (each within the first-byte bound, one probe for a whole answer, answered by the other
    replica, the frozen one tried once). `victim`: the replica to freeze, else the one that
    begins the first stream."""
    # A stream cut midway: its replica frozen after its first events.
    while True:
        with timed(gateway, secret, stream=True, max_tokens=40) as (answer, lines, took):
            began = int(answer.headers["x-appliance-replica"])
            events = answer.iter_lines()
            lines.append(next(line for line in events if line))
            assert lines[0].startswith(b"data: {")
            if victim is not None and began != victim:
                continue  # (round robin: the next stream begins on the other)
            victim = began
            freeze(victim)
            frozen_at = time.monotonic()
            lines.extend(line for line in events if line)
        break
    cut_after = time.monotonic() - frozen_at
    print(f"{what}: the stream under way ended {cut_after:.1f} s after the freeze")
    error = error_event(lines)
    assert error["code"] == "engine_timeout" and "idle-stream timeout" in error["message"]
    assert cut_after < IDLE_S + SLACK_S
    assert len(lines) > 3  # events before the freeze came through, then the error

    # Not yet answered: the first-byte timeout, then once on the other replica.
    thaw(victim)
    wait_for(lambda: call(gateway, secret, stream=False)[0].headers[
        "x-appliance-replica"] == str(victim), timeout_s=60)  # back in rotation
    freeze(victim)
    streamed = [call(gateway, secret, stream=True) for _ in range(3)]
    # A whole answer waits past the first byte only while /health answers: frozen, it
    # does not, so one probe's time more at most.
    whole = [call(gateway, secret, stream=False) for _ in range(3)]
    retried_once_elsewhere(streamed + whole, str(1 - victim),
                           FIRST_BYTE_S + PROBE_TIMEOUT_S + SLACK_S)
    for answer, _, took in streamed + whole:
        if answer.headers.get("x-appliance-retried"):
            print(f"{what}: a request not yet answered came from the other replica after "
                  f"{took:.1f} s")
            assert took >= FIRST_BYTE_S  # it did wait for the frozen one first
    assert all(took < SLACK_S for a, _, took in streamed + whole
               if not a.headers.get("x-appliance-retried"))  # none waits on it again


def test_a_paused_engine_container_delays_no_request_past_the_timeouts(
        gateway: str, operator: Any, key_for: Any, docker_client: Any,  # noqa: F811
        test_engine_image: str) -> None:  # noqa: F811
    slow = {"TEST_ENGINE_TOKEN_S": "0.1"}  # a 40-token stream lasts 4 s: time to pause it
    with engines(docker_client, test_engine_image, slow, slow) as (containers, urls):
        replicas("paused", urls)
        frozen_replica(gateway, key_for(operator), "paused engine",
                       lambda i: containers[i].pause(), lambda i: containers[i].unpause())


@pytest.fixture(scope="session")
def sim_image(docker_client: Any) -> str:  # noqa: F811
    """The simulated host's image, built from this checkout (under the Docker lock), or one
    already built that APPLIANCE_TEST_SIM_HOST_IMAGE names."""
    return os.environ.get("APPLIANCE_TEST_SIM_HOST_IMAGE") or sim_host_image(docker_client)


@pytest.mark.e2e
def test_a_paused_host_delays_no_request_past_the_timeouts(
        tmp_path: Path, live_channel: Any, operator: Any, key_for: Any,
        docker_client: Any, test_engine_image: str, sim_image: str) -> None:  # noqa: F811
    """Replica 0's engine runs on a simulated fleet host (docker/sim-host: its own Docker,
    the host's agent joined to this panel), replica 1's on this machine's Docker; the host
    is frozen whole (its engine, its agent and its Docker paused; its network still answers
    in the kernel), as a frozen machine or a stalled VM."""
    networks = host_networks(docker_client, ["gw-host"])
    allowed = ",".join(["localhost", "127.0.0.1", network_gateway(networks["gw-host"])])
    token = fleet.jointoken_create(host_name="gw-host").secret
    slow = {"TEST_ENGINE_TOKEN_S": "0.1"}
    with panel_server(tmp_path / "web.log", bind="0.0.0.0", APPLIANCE_ALLOWED_HOSTS=allowed,
                      **BOUNDS) as url, \
            sim_hosts(docker_client, sim_image, {"gw-host": token}, networks=networks,
                      panel_port=int(url.rsplit(":", 1)[1])) as hosts, \
            engines(docker_client, test_engine_image, slow) as (_, [outside]):
        host = hosts["gw-host"]
        # This machine's test engine image, loaded into the host's own Docker (the host's
        # imported simulator is built without the recordings the engine may read).
        loaded = subprocess.run(f"docker save {test_engine_image} | docker exec -i "
                                f"{host.container.name} docker load", shell=True, check=False,
                                capture_output=True, text=True, timeout=300)
        assert loaded.returncode == 0, loaded.stderr[-1000:]
        host.run("docker", "run", "-d", "--name", "gw-engine", "-p", "30000:30000",
                 "-e", "TEST_ENGINE_PACE_S=0.01", "-e", "TEST_ENGINE_TOKEN_S=0.1",
                 test_engine_image, *launch_argv())
        inside = f"http://{host.address()}:30000"
        try:
            wait_for(lambda: _healthy(inside), timeout_s=90)
        except BaseException:
            print(host.run("docker", "ps", "-a"), host.run("docker", "logs", "--tail", "30",
                                                           "gw-engine"))
            raise
        replicas("on-host", [inside, outside])

        def freeze(_: int) -> None:
            # The whole host: its engine too. Here (cgroup v1, the host's /sys/fs/cgroup
            # shared) the host's engines' cgroups are not under the host container's, so
            # `docker pause` of the host alone stops its agent and Docker and leaves its
            # engines serving (seen: /health answered); the engine is paused first, by the
            # host's own Docker, while that still answers.
            host.run("docker", "pause", "gw-engine")
            host.pause()

        def thaw(_: int) -> None:
            host.unpause()
            host.run("docker", "unpause", "gw-engine")

        try:
            frozen_replica(url, key_for(operator), "paused host", freeze, thaw, victim=0)
        finally:  # a frozen engine cannot be killed: the host would not be removed
            with contextlib.suppress(Exception):
                thaw(0)


def test_a_hung_engine_process_delays_no_request_past_the_timeouts(
        gateway: str, operator: Any, key_for: Any, docker_client: Any,  # noqa: F811
        test_engine_image: str) -> None:  # noqa: F811
    """The engine's HTTP server answers (/health 200) while its scheduler makes nothing: a
    stream gets its head and no event; a whole answer is waited for to the whole-answer
    bound (the engine says it is alive), then goes to the other replica."""
    hung = {"TEST_ENGINE_FAIL": "hang-serve"}
    midway = {"TEST_ENGINE_FAIL": "hang-serve", "TEST_ENGINE_HANG_AFTER_TOKENS": "3"}
    with engines(docker_client, test_engine_image, hung, {}, midway) as (_, urls):
        replicas("hung", urls[:2])
        replicas("hung-midway", urls[2:], served="midway-model")
        secret = key_for(operator)
        whole = [call(gateway, secret, stream=False) for _ in range(2)]
        streamed = [call(gateway, secret, stream=True) for _ in range(3)]
        retried_once_elsewhere(whole + streamed, "1", WHOLE_S + SLACK_S)
        [(_, _, took)] = [w for w in whole if w[0].headers.get("x-appliance-retried")]
        print(f"hung engine: a whole answer came from the other replica after {took:.1f} s")
        assert took >= WHOLE_S  # alive by /health: waited for to the whole-answer bound
        assert all(took < SLACK_S for _, _, took in streamed)  # the hung one is out

        # Cut midway: three tokens, then nothing; the stream ends with an error event.
        answer, lines, took = call(gateway, secret, stream=True, model="midway-model",
                                   max_tokens=10)
        assert answer.status_code == 200
        error = error_event(lines)
        assert error["code"] == "engine_timeout" and "idle-stream timeout" in error["message"]
        content = [json.loads(line.removeprefix(b"data: "))["choices"][0]["delta"]
                   for line in lines[:-2]]
        assert [d.get("content") for d in content if d.get("content")], lines
        print(f"hung engine: the stream cut midway ended after {took:.1f} s")
        assert took < IDLE_S + SLACK_S + 1  # (its three tokens, then the idle bound)
        # Alone, the hung replica is still tried (rather than refused), and still bounded:
        # a stream's head went out, so the answer is its error event.
        answer, lines, took = call(gateway, secret, stream=True, model="midway-model")
        assert error_event(lines)["code"] == "engine_timeout"
        assert took < FIRST_BYTE_S + SLACK_S


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False

