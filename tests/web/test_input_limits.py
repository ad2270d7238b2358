"""Hostile input gets a 4xx that names the problem, never a 500: bodies over the limit,
deep JSON, huge numbers, out-of-range pagination and event ids, GPUs the host lacks."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone

from tests.hostrows import host_reported
from tests.servers import login_session, panel_server
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.sse import _start_seq
from web.fleet.models import FleetHost

pytestmark = pytest.mark.django_db


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _post(client: Client, body: object | str, path: str = "/api/deployments/"):  # type: ignore[no-untyped-def]
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(path, data, content_type="application/json")


def test_a_body_over_the_limit_is_a_413_with_a_json_error(operator) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"spec": spec(engine__model_path="/m/" + "a" * 20_000_000)})
    for path in ("/api/deployments/", "/api/preflight/", "/deployments/new/", "/login/"):
        response = _client(operator).post(path, body, content_type="application/json")
        assert response.status_code == 413, path
        assert "limit" in response.json()["detail"]


def test_json_nested_too_deep_is_a_400_that_says_so(operator) -> None:  # type: ignore[no-untyped-def]
    for depth in (100, 1000, 100_000):
        body = '{"spec": ' + "[" * depth + "]" * depth + "}"
        response = _post(_client(operator), body)
        assert response.status_code == 400, depth
        assert "nested deeper" in response.json()["detail"]


@pytest.mark.parametrize("number", ["1" + "0" * 4000, "1e4000", "-1e4000"])
def test_a_huge_number_is_a_field_error(operator, number: str) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"spec": spec(), "confirm_warnings": True}).replace(
        '"tp_size": 1', f'"mem_fraction_static": {number}, "tp_size": 1')
    response = _post(_client(operator), body)
    assert response.status_code == 400
    assert "engine.mem_fraction_static" in response.json(), response.json()
    assert not Deployment.objects.exists()


def test_a_number_longer_than_python_parses_is_a_400(operator) -> None:  # type: ignore[no-untyped-def]
    body = '{"spec": {"gpus": [' + "9" * 5000 + "]}}"
    assert _post(_client(operator), body).status_code == 400


@pytest.mark.parametrize(("query", "name"), [
    ("limit=9223372036854775808", "limit"), ("offset=9223372036854775808", "offset"),
    ("limit=0", "limit"), ("offset=-1", "offset"), ("limit=abc", "limit"),
    ("limit=%C2%B2", "limit"), ("offset=1e3", "offset")])
def test_pagination_out_of_range_is_a_400_naming_the_parameter(viewer, query: str, name: str) -> None:  # type: ignore[no-untyped-def]
    response = _client(viewer).get(f"/api/deployments/?{query}")
    assert response.status_code == 400 and name in response.json(), response.json()


def test_pagination_in_range_answers_a_page(viewer) -> None:  # type: ignore[no-untyped-def]
    response = _client(viewer).get("/api/deployments/?limit=1000&offset=1000000000")
    assert response.status_code == 200 and response.json()["results"] == []


@pytest.mark.parametrize("after", ["9223372036854775808", "-1", "1" * 40, "x"])
def test_events_after_a_seq_out_of_range_is_a_400(viewer, after: str) -> None:  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    response = _client(viewer).get(f"/api/deployments/{pk}/events/?after={after}")
    assert response.status_code == 400 and "after" in response.json()
    top = _client(viewer).get(f"/api/deployments/{pk}/events/?after=9223372036854775807")
    assert top.status_code == 200 and top.json()["results"] == []


@pytest.mark.parametrize(("raw", "seq"), [("12", 12), ("18446744073709551616", 0),
                                          ("9223372036854775808", 0), ("abc", 0), ("-3", 0),
                                          ("1" * 5000, 0), ("\u0661", 0)])
def test_a_last_event_id_that_is_no_seq_replays_from_the_start(raw: str, seq: int) -> None:
    request = RequestFactory().get("/", HTTP_LAST_EVENT_ID=raw)
    assert _start_seq(request) == seq


@pytest.mark.django_db(transaction=True)
def test_under_the_asgi_server_huge_ids_and_bodies_are_handled(tmp_path: Path, live_channel, viewer) -> None:  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    services.deployment_stop(deployment_id=deployment.pk)
    with panel_server(tmp_path / "uvicorn.log") as url:
        session = login_session(url, "vera", "viewer-pass-1")
        stream = f"{url}/deployments/{deployment.pk}/events/stream/"
        for last in (str(2**64), str(2**63), "not-a-number"):
            started = time.monotonic()
            answer = session.get(stream, headers={"Last-Event-ID": last}, timeout=20)
            assert answer.status_code == 200 and time.monotonic() - started < 15
            assert '"kind": "end"' in answer.text or '"kind":"end"' in answer.text, last
        big = session.post(f"{url}/api/preflight/", data=b"{" + b" " * 3_000_000 + b"}",
                           headers={"Content-Type": "application/json"}, timeout=20)
        assert big.status_code == 413
    assert "Traceback" not in (tmp_path / "uvicorn.log").read_text()


def test_gpu_ids_the_host_lacks_are_refused(operator) -> None:  # type: ignore[no-untyped-def]
    with override_settings(GPU_COUNT=8):
        response = _post(_client(operator), {"spec": spec(gpus=[8]), "confirm_warnings": True})
    assert response.status_code == 400 and "not on this host" in " ".join(response.json()["gpus"])
    host_reported(name="h", agent_id="a", heartbeat_at=timezone.now(),
                  gpu_telemetry={"available": True, "gpus": [{"index": 0}, {"index": 1}]})
    response = _post(_client(operator), {"spec": spec(gpus=[2]), "confirm_warnings": True})
    assert response.status_code == 400 and "2 GPUs" in " ".join(response.json()["gpus"])
    FleetHost.objects.filter(name="h").update(heartbeat_at=timezone.now() - timedelta(hours=1))
    response = _post(_client(operator), {"spec": spec(gpus=[2]), "confirm_warnings": True})
    assert response.status_code == 201  # a stale report says nothing; no count is configured


def test_the_hosts_gpu_architecture_reaches_pre_flight(operator) -> None:  # type: ignore[no-untyped-def]
    """fa3 on Blackwell GPUs the agent reports: refused before anything is stored."""
    blackwell = [{"index": i, "name": "NVIDIA B200", "compute_capability": "10.0"}
                 for i in range(2)]
    host_reported(name="b", agent_id="a", heartbeat_at=timezone.now(),
                  docker={"nvidia": True, "runtimes": ["nvidia", "runc"]},
                  gpu_telemetry={"available": True, "gpus": blackwell})
    response = _post(_client(operator), {"spec": spec(gpus=[0]), "confirm_warnings": True})
    assert response.status_code == 400
    assert "gpu-arch-attention-backend" in " ".join(response.json()["engine.attention_backend"])
    response = _post(_client(operator), {"spec": spec(gpus=[0], engine__attention_backend="triton"),
                                         "confirm_warnings": True})
    assert response.status_code == 201, response.json()


def test_extra_args_findings_name_the_item_as_written(operator) -> None:  # type: ignore[no-untyped-def]
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz12"
    data = spec(extra_args=["--dp-size", "1", "--api-key", f" {token}"])
    response = _post(_client(operator), {"spec": data, "confirm_warnings": True})
    assert response.status_code == 400 and "extra_args[3]" in response.json(), response.json()
    assert token not in json.dumps(response.json())


@pytest.mark.parametrize("value", ["abcdefgh\x00ijklmnop", '"abcdefgh\\000ijk"', "a" * 5000])
def test_a_malformed_session_cookie_is_no_session_not_a_500(value: str) -> None:
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = value
    assert client.get("/").status_code == 302  # to the login page
    assert client.get("/api/deployments/").status_code in {401, 403}
