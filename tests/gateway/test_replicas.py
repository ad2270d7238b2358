"""The gateway across a deployment's replicas (each a Deployment row: replica 0 and rows with
replica_of = it), through the panel's uvicorn, real PostgreSQL and Redis, with OpenAI
stand-ins (tests/openai_standin.py) as the replicas' engines: spreading, draining, the
in-flight counter, a lost host, failover with one retry, a stream cut midway, and a
companion for what a speculative mode refuses."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import requests
from django.conf import settings
from django.utils import timezone

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.conftest_docker import (  # noqa: F401
    FAST_ENV,
    TEST_LABELS,
    docker_client,
    host_port,
    test_engine_image,
    wait_for,
)
from tests.openai_standin import StandIn, standin
from tests.servers import panel_server
from tests.specs import spec
from web.deployments.inflight import inflight_key, replica_inflight
from web.deployments.models import Deployment, DeploymentStatus
from web.fleet.models import FleetHost, Placement
from web.gateway.bounds import DEAD_PEER_S
from web.gateway.models import ApiKeyUsage

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "standin-model"
SILENT_S = 3  # the panel's APPLIANCE_AGENT_SILENT_S here: a host is lost after this


@pytest.fixture
def gateway(tmp_path: Path, live_channel) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log", APPLIANCE_AGENT_SILENT_S=str(SILENT_S)) as url:
        yield url


@contextlib.contextmanager
def engines(count: int, **options: Any) -> Iterator[list[StandIn]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(standin(**options)) for _ in range(count)]


def replicas(name: str, urls: list[str], *, algorithm: str = "NONE", served: str = MODEL,
             **changes: Any) -> list[Deployment]:
    """Replica 0 and its replica rows, ready, as the replicas' create code makes them."""
    data = spec(name=name, engine__served_model_name=served, **changes)
    rows: list[Deployment] = []
    for i, url in enumerate(urls):
        rows.append(Deployment.objects.create(
            name=name, spec=data, recipe=data["recipe"], algorithm=algorithm, gpus=data["gpus"],
            status=DeploymentStatus.READY, engine_url=url,
            replica_of=rows[0] if rows else None, replica_index=i))
    return rows


def call(url: str, secret: str, content: str | list[dict[str, str]], **extra: Any) -> requests.Response:
    body = {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": content}], **extra}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {secret}"}, stream=bool(
                             extra.get("stream")))


def test_requests_spread_over_three_replicas_and_a_drained_one_gets_none(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(3) as served:
        rows = replicas("spread", [s.url for s in served])
        secret = key_for(operator, deployments=rows[:1])  # the scope names replica 0 alone
        answers = [call(gateway, secret, f"prompt {i}") for i in range(30)]
        assert [a.status_code for a in answers] == [200] * 30
        # Each prompt's own replica is a hash of it and the rows' ids (which vary from run to
        # run): 2 of 30 at least, which a fair hash misses in about 1 run in 10,000 (4 of 30
        # failed about 1 in 100).
        assert all(len(s.seen) >= 2 for s in served), [len(s.seen) for s in served]
        assert sorted({a.headers["x-appliance-replica"] for a in answers}) == ["0", "1", "2"]
        listed = requests.get(f"{gateway}/v1/models", timeout=10,
                              headers={"Authorization": f"Bearer {secret}"}).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]  # one model, however many replicas

        Deployment.objects.filter(pk=rows[2].pk).update(draining=True)
        time.sleep(0.3)  # the trigger's notification reaches the panel's watch
        before = len(served[2].seen)
        answers = [call(gateway, secret, f"drained {i}") for i in range(20)]
        assert [a.status_code for a in answers] == [200] * 20
        assert len(served[2].seen) == before
        assert {a.headers["x-appliance-replica"] for a in answers} == {"0", "1"}
    # Usage is the key's, on the deployment people see (replica 0), whichever replica served.
    usage = list(ApiKeyUsage.objects.values_list("deployment_id", "requests"))
    assert usage == [(rows[0].pk, 50)]


def test_one_prompt_prefix_goes_to_one_replica_while_it_is_not_loaded(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(3) as served:
        rows = replicas("affine", [s.url for s in served])
        secret = key_for(operator)
        shared = "You are a careful assistant. " * 20  # one first block for every request
        answers = [call(gateway, secret, shared + f"question {i}") for i in range(12)]
        assert len({a.headers["x-appliance-replica"] for a in answers}) == 1
        assert sorted(len(s.seen) for s in served) == [0, 0, 12]
        assert rows


def test_the_in_flight_counter_counts_a_relayed_stream_until_it_ends(
        gateway: str, operator: Any, key_for: Any) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    with engines(1) as served:
        [row] = replicas("counted", [served[0].url])
        secret = key_for(operator)
        served[0].pace_s = 0.05  # 200 events over 10 s: the relay is under way a while
        body = json.dumps({"model": MODEL, "max_tokens": 200, "stream": True,
                           "messages": [{"role": "user", "content": "count me"}]})
        connection = http.client.HTTPConnection(urlsplit(gateway).netloc, timeout=30)
        connection.request("POST", "/v1/chat/completions", body,
                           {"Authorization": f"Bearer {secret}",
                            "Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200
        assert answer.readline().startswith(b"data: ")
        deadline = time.monotonic() + 3
        while replica_inflight(client=client, deployment_id=row.pk) != 1:
            assert time.monotonic() < deadline, "no in-flight count while relaying"
            time.sleep(0.02)
        assert 0 < client.ttl(inflight_key(deployment_id=row.pk)) <= 900
        connection.close()  # the client leaves: the relay ends, and its count with it
        deadline = time.monotonic() + 5
        while replica_inflight(client=client, deployment_id=row.pk) != 0:
            assert time.monotonic() < deadline, "the count stayed after the stream ended"
            time.sleep(0.02)


def test_a_replica_on_a_lost_host_leaves_the_rotation_within_two_seconds(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(2) as served:
        rows = replicas("hosted", [s.url for s in served])
        host = FleetHost.objects.create(name="gpu-2", credential_prefix="p1",
                                        credential_digest="d" * 64,
                                        credential_made_at=timezone.now(),
                                        heartbeat_at=timezone.now())
        Placement.objects.create(deployment=rows[1], replica=1, host=host, reason="test")
        secret = key_for(operator)
        # The host's heartbeat stops now: it is lost SILENT_S later.
        beat = timezone.now()
        FleetHost.objects.filter(pk=host.pk).update(heartbeat_at=beat)
        lost_at = time.time() + SILENT_S
        last_there = 0.0
        i = 0
        while time.time() < lost_at + 3:
            answer = call(gateway, secret, f"p {i}")
            i += 1
            assert answer.status_code == 200
            if answer.headers["x-appliance-replica"] == "1":
                last_there = time.time()
        assert last_there > lost_at - 1.5, "the replica got no requests before its host was lost"
        failover = last_there - lost_at
        print(f"lost host: last request there {failover:+.3f} s after it turned lost")
        assert failover <= 2.0
        assert served[1].seen and rows


def test_a_replica_that_refuses_or_answers_503_is_retried_once_elsewhere_and_skipped(
        gateway: str, operator: Any, key_for: Any) -> None:
    with standin() as gone:
        gone_url = gone.url  # nothing listens there from now: connections are refused
    with engines(2) as served:
        rows = replicas("failing", [gone_url, served[0].url, served[1].url])
        secret = key_for(operator)
        # No text to hash (content parts): no prefix affinity, the picks go round, so the
        # gone replica is tried (and ejected) for sure. With prefix affinity it was tried only
        # where a prompt's hash chose it: in 1.7 % of runs none did (the rows' ids vary), and
        # the next phase's retry could then reach it (CI, 2026-12-05).
        answers = [call(gateway, secret, [{"type": "text", "text": f"q {i}"}])
                   for i in range(10)]
        assert [a.status_code for a in answers] == [200] * 10  # refused: retried once
        assert {a.headers["x-appliance-replica"] for a in answers} == {"1", "2"}
        assert any(a.headers.get("x-appliance-retried") for a in answers)
        served[0].fail_with = 503  # as an engine going away answers
        answers = [call(gateway, secret, f"r {i}") for i in range(10)]
        assert [a.status_code for a in answers] == [200] * 10
        assert {a.headers["x-appliance-replica"] for a in answers[1:]} == {"2"}
        refused = [b for b in served[0].seen if str(b["messages"][0]["content"]).startswith("r ")]
        assert len(refused) <= 1  # ejected at its first 503, probed by /health since
        # Back once its /health answers again.
        served[0].fail_with = None
        time.sleep(1.0)
        answers = [call(gateway, secret, f"s {i}") for i in range(20)]
        assert "1" in {a.headers["x-appliance-replica"] for a in answers}
        assert rows


def test_a_retry_goes_to_a_replica_on_another_host_when_the_first_ones_host_failed(
        gateway: str, operator: Any, key_for: Any) -> None:
    """A host that dies takes all its replicas with it before its heartbeat says so: the one
    retry skips the failed replica's host (replicas 0 and 1 on gpu-2, both gone)."""
    gone = []
    for _ in range(2):
        with standin() as engine:
            gone.append(engine.url)  # nothing listens there from now: connections refused
    with engines(1) as served:
        rows = replicas("hosted-pair", [*gone, served[0].url])
        host = FleetHost.objects.create(name="gpu-2", credential_prefix="p2",
                                        credential_digest="e" * 64,
                                        credential_made_at=timezone.now(),
                                        heartbeat_at=timezone.now())
        for row in rows[:2]:
            Placement.objects.create(deployment=row, replica=row.replica_index, host=host,
                                     reason="test")
        secret = key_for(operator)
        # No text to hash (content parts): no prefix affinity, the picks go round from
        # replica 1, whose retry without the host rule is replica 0, on the same dead host.
        parts = [{"type": "text", "text": "no affinity"}]
        answers = [call(gateway, secret, parts) for _ in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        assert {a.headers["x-appliance-replica"] for a in answers} == {"2"}
        assert answers[0].headers.get("x-appliance-retried") == "1"


def test_the_retry_reaches_a_ready_replica_the_rotation_left_out_for_a_late_heartbeat(
        gateway: str, operator: Any, key_for: Any) -> None:
    """A host whose heartbeat is a moment late reads lost to the rotation, though its
    engine serves (in the trial a host beats every 10 s against a 10 s threshold). When the
    only replica left in the rotation is on a host whose Docker just stopped (its row still
    ready, its port refusing), its failure is retried on the left-out replica: the client
    gets an answer, never the gateway's 503 engine_unreachable."""
    with standin() as stopped:
        refused_url = stopped.url  # nothing listens there from now: connections refused
    with engines(1) as served:
        rows = replicas("late-beat", [served[0].url, refused_url])
        # sim-a's last beat is past the threshold; sim-b's is dated ahead, so it stays fresh
        # however slowly this test runs.
        now = timezone.now()
        hosts = [FleetHost.objects.create(
            name=name, credential_prefix=f"p{i}", credential_digest=str(i) * 64,
            credential_made_at=now, heartbeat_at=now + timedelta(seconds=offset))
            for i, (name, offset) in enumerate((("sim-a", -SILENT_S - 2), ("sim-b", 60)))]
        for row, host in zip(rows, hosts, strict=True):
            Placement.objects.create(deployment=row, replica=row.replica_index, host=host,
                                     reason="test")
        secret = key_for(operator)
        time.sleep(1.5)  # the gateway's watch reads the heartbeats each second
        answers = [call(gateway, secret, f"during the restart {i}") for i in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, [a.text[:200] for a in answers]
        assert {a.headers["x-appliance-replica"] for a in answers} == {"0"}
        assert answers[0].headers.get("x-appliance-retried") == "1"
        assert len(served[0].seen) == 6


@pytest.mark.docker
def test_a_request_in_flight_to_a_host_that_vanishes_is_answered_by_another_replica(
        gateway: str, operator: Any, key_for: Any, docker_client: Any,  # noqa: F811
        test_engine_image: str) -> None:  # noqa: F811
    """A host cut off mid-request sends no reset: TCP's own dead-peer check (keep-alive
    probes, a user timeout: web/gateway/upstream.py) ends the silent connection, and the
    request, not yet answered, goes to the other replica instead of hanging."""
    data = spec(name="vanished", engine__served_model_name=MODEL)
    argv = launch_args(spec_from_dict(data)).argv
    slow = {**FAST_ENV, "TEST_ENGINE_TOKEN_S": "1.0"}  # a minute for the 60 tokens asked
    containers = [docker_client.containers.run(
        test_engine_image, command=argv, detach=True, environment=env, labels=dict(TEST_LABELS),
        ) for env in (slow, dict(FAST_ENV))]
    try:
        urls = []
        for container in containers:
            container.reload()  # reached at its own address on the bridge, as a host's would be
            address = container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
            urls.append(f"http://{address}:30000")
        for url in urls:
            wait_for(lambda url=url: _healthy(url), timeout_s=90)
        replicas("vanished", urls)
        secret = key_for(operator)
        parts = [{"type": "text", "text": "no affinity"}]  # round robin: replica 1 first
        assert call(gateway, secret, parts).headers["x-appliance-replica"] == "1"
        answer: list[requests.Response] = []
        relay = threading.Thread(target=lambda: answer.append(
            call(gateway, secret, parts, max_tokens=60)))
        relay.start()
        time.sleep(2)  # the request is generating on replica 0
        assert relay.is_alive()
        # Off the network: no FIN, no RST, its address simply gone.
        docker_client.networks.get("bridge").disconnect(containers[0], force=True)
        cut_at = time.monotonic()
        relay.join(40)
        assert answer, "the request hung on the vanished host"
        took = time.monotonic() - cut_at
        print(f"vanished host: the request answered by the other replica {took:.1f} s after")
        assert answer[0].status_code == 200, answer[0].text
        assert answer[0].headers["x-appliance-replica"] == "1"
        assert answer[0].headers.get("x-appliance-retried") == "1"
        assert took < DEAD_PEER_S + 5
    finally:
        for container in containers:
            container.remove(force=True)


def test_a_stream_broken_before_its_first_event_is_retried_and_one_cut_midway_ends_with_an_error(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(2) as served:
        replicas("cut", [s.url for s in served])
        secret = key_for(operator)
        served[0].cut_after = 0
        for i in range(6):  # every stream whole, whichever replica began it
            with call(gateway, secret, f"s {i}", stream=True) as answer:
                lines = [line for line in answer.iter_lines() if line]
            assert lines[-1] == b"data: [DONE]" and b"error" not in b"".join(lines)
        served[0].cut_after, served[1].cut_after = 2, 2
        with call(gateway, secret, "midway", stream=True, max_tokens=8) as answer:
            started = time.monotonic()
            lines = [line for line in answer.iter_lines() if line]
        assert time.monotonic() - started < 5
        assert lines[-1] == b"data: [DONE]"
        error = json.loads(lines[-2].removeprefix(b"data: "))["error"]
        assert error["code"] == "engine_stream_broken"
        assert len(lines) == 4  # two token events, the error, [DONE]


LOGPROBS = {"logprobs": True, "top_logprobs": 2}


def test_a_ddtree_deployment_hands_log_probs_to_its_companion_and_says_so(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(2, logprobs=False) as fast, engines(1, model="kimi-base-model") as base:
        replicas("kimi-base", [base[0].url], served="kimi-base-model")
        rows = replicas("kimi-ddtree", [s.url for s in fast], algorithm="DDTREE",
                        companion="kimi-base")
        secret = key_for(operator, deployments=rows[:1])  # the companion is not in scope
        time.sleep(0.3)
        answer = call(gateway, secret, "with log-probs", **LOGPROBS)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-appliance-served-by"] == "kimi-base"
        assert answer.json()["choices"][0]["logprobs"]["content"]
        assert len(base[0].seen) == 1 and not fast[0].seen + fast[1].seen
        assert base[0].seen[0]["model"] == "kimi-base-model"  # named as the companion serves
        plain = call(gateway, secret, "without")
        assert plain.status_code == 200 and "x-appliance-served-by" not in plain.headers
        grammar = call(gateway, secret, "json", response_format={"type": "json_object"})
        assert grammar.headers["x-appliance-served-by"] == "kimi-base"
        # n > 1 is served by DDTREE itself (the recordings: 200 with two choices).
        many = call(gateway, secret, "two", n=2)
        assert "x-appliance-served-by" not in many.headers
    usage = dict(ApiKeyUsage.objects.values_list("deployment__name", "requests"))
    assert usage == {"kimi-base": 2, "kimi-ddtree": 2}  # per key, on the one that served


def test_without_a_companion_a_refused_need_is_a_400_naming_it_and_the_fix(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(1, logprobs=False) as fast:
        replicas("lone-ddtree", [fast[0].url], algorithm="DDTREE")
        secret = key_for(operator)
        answer = call(gateway, secret, "with log-probs", **LOGPROBS)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["message"].startswith("DDTREE cannot return log-probs")
        assert "companion: <name>" in error["message"] and error["param"] == "logprobs"
        assert error["code"] == "unsupported_by_speculative_mode"
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        named = call(gateway, secret, "tool", tools=tools,
                     tool_choice={"type": "function", "function": {"name": "f"}})
        assert named.status_code == 400 and named.json()["error"]["param"] == "tool_choice"
        assert not fast[0].seen  # refused at the gateway: the engine did no work for it
    assert not ApiKeyUsage.objects.exists()


@pytest.mark.docker
def test_a_replica_whose_engine_container_is_killed_leaves_the_rotation_within_two_seconds(
        gateway: str, operator: Any, key_for: Any, docker_client: Any,  # noqa: F811
        test_engine_image: str) -> None:  # noqa: F811
    """Two test engines (docker/test-engine) as the product launches them, one killed
    (SIGKILL) under a steady stream of requests: none fails, and the gateway stops sending
    to it at the first request it fails (answered by the other, `X-Appliance-Retried`)."""
    data = spec(name="killed", engine__served_model_name=MODEL)
    argv = launch_args(spec_from_dict(data)).argv
    containers = [docker_client.containers.run(
        test_engine_image, command=argv, detach=True, environment=dict(FAST_ENV),
        labels=dict(TEST_LABELS), ports={"30000/tcp": ("127.0.0.1", None)}) for _ in range(2)]
    try:
        urls = [f"http://127.0.0.1:{host_port(c)}" for c in containers]
        for url in urls:
            wait_for(lambda url=url: _healthy(url), timeout_s=90)
        replicas("killed", urls)
        secret = key_for(operator)
        before = [call(gateway, secret, f"before {i}") for i in range(20)]  # both, but 1 in 500,000
        assert {a.headers["x-appliance-replica"] for a in before} == {"0", "1"}
        containers[0].kill()
        killed_at = time.monotonic()
        after: list[tuple[float, requests.Response]] = []
        while time.monotonic() < killed_at + 3:
            answer = call(gateway, secret, f"after {len(after)}")
            after.append((time.monotonic() - killed_at, answer))
        assert [a.status_code for _, a in after] == [200] * len(after)
        assert {a.headers["x-appliance-replica"] for _, a in after} == {"1"}
        retried = [at for at, a in after if a.headers.get("x-appliance-retried")]
        # The gateway sent to the dead engine once (that request answered by the other),
        # then never again: its /health does not answer.
        assert len(retried) == 1, retried
        print(f"killed engine: out of the rotation {retried[0]:.3f} s after the kill, "
              f"{len(after)} requests after it, none failed")
        assert retried[0] <= 2.0
    finally:
        for container in containers:
            container.remove(force=True)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_a_companion_that_is_not_ready_is_a_503_naming_it(
        gateway: str, operator: Any, key_for: Any) -> None:
    with engines(1, logprobs=False) as fast:
        replicas("waiting-ddtree", [fast[0].url], algorithm="DDTREE", companion="not-yet")
        secret = key_for(operator)
        answer = call(gateway, secret, "with log-probs", **LOGPROBS)
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "companion_not_ready" and "'not-yet'" in error["message"]
        assert call(gateway, secret, "plain").status_code == 200  # the rest it serves
        assert len(fast[0].seen) == 1
