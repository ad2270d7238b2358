"""What a host's agent calls: the join with a join token, then its heartbeat, its
placements, its engines' status steps and events with its own credential, and nothing else
with it."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.rows import queued, ready
from web.deployments import services as dservices
from web.deployments.models import Deployment, Event, MetricPoint
from web.deployments.silence import deployment_silence
from web.fleet import selectors, services
from web.fleet.models import FleetHost, JoinToken

from .hosts import joined, report

pytestmark = pytest.mark.django_db


def _post(path: str, body: dict, credential: str = "") -> tuple[int, dict]:  # type: ignore[type-arg]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {credential}"} if credential else {}
    # enforce_csrf_checks: the host's views must not need a CSRF token (they read no cookie).
    answer = Client(enforce_csrf_checks=True).post(path, json.dumps(body),
                                                   content_type="application/json", **headers)
    return answer.status_code, answer.json()


def _join(name: str = "gpu-2") -> tuple[int, dict]:  # type: ignore[type-arg]
    made = services.jointoken_create(host_name=name)
    return _post("/api/fleet/join/", {"token": made.secret, "name": name, **report()})


def test_a_host_joins_over_the_api_and_receives_its_credential_once() -> None:
    status, body = _join()
    assert status == 201, body
    assert body["credential"].startswith("sdh-") and body["host"] == "gpu-2"
    assert body["heartbeat_s"] == 10 and body["lost_after_s"] >= 1
    host = FleetHost.objects.get()
    assert body["credential"] not in json.dumps(list(FleetHost.objects.values()), default=str)
    status, me = _post("/api/fleet/host/heartbeat/", report(), body["credential"])
    assert status == 200 and "credential" not in me and me["host"] == "gpu-2"
    host.refresh_from_db()
    assert host.credential_last_used_at is not None


def test_a_spent_join_token_is_refused_saying_so_and_the_host_keeps_its_credential() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    status, body = _post("/api/fleet/join/", {"token": made.secret, "name": "gpu-2", **report()})
    assert status == 201
    status, again = _post("/api/fleet/join/", {"token": made.secret, "name": "gpu-2",
                                                **report()})
    assert status == 403 and again["detail"].startswith(
        f"This join token (sdj-{made.token.prefix}) was spent when host 'gpu-2' joined")
    status, _ = _post("/api/fleet/host/heartbeat/", report(), body["credential"])
    assert status == 200


def test_an_expired_join_token_is_refused_saying_so() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    JoinToken.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    status, body = _post("/api/fleet/join/", {"token": made.secret, "name": "gpu-2", **report()})
    assert status == 403 and "expired" in body["detail"] and not FleetHost.objects.exists()


def test_a_join_without_a_token_names_the_field() -> None:
    status, body = _post("/api/fleet/join/", {"name": "gpu-2", **report()})
    assert status == 400 and "token" in body


def test_a_join_with_a_bad_report_names_the_field() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    status, body = _post("/api/fleet/join/", {"token": made.secret, "name": "gpu-2",
                                              **report(agent_version="")})
    assert status == 400 and "agent_version" in body and not FleetHost.objects.exists()


def test_a_body_that_is_not_json_is_a_400_not_a_500() -> None:
    answer = Client().post("/api/fleet/join/", "{nope", content_type="application/json")
    assert answer.status_code == 400 and "not JSON" in answer.json()["detail"]


def test_a_heartbeat_without_or_with_a_wrong_credential_is_401() -> None:
    assert _post("/api/fleet/host/heartbeat/", report())[0] == 401
    assert _post("/api/fleet/host/heartbeat/", report(), "sdh-nothing")[0] == 401
    answer = Client().post("/api/fleet/host/heartbeat/", "{}", content_type="application/json")
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_removed_hosts_credential_is_refused() -> None:
    done = joined("gpu-2")
    services.host_remove(name="gpu-2")
    status, body = _post("/api/fleet/host/heartbeat/", report(), done.credential)
    assert status == 401 and "join again" in body["detail"]


def test_a_hosts_driver_version_is_kept_with_its_gpus_and_a_bad_one_is_refused() -> None:
    from web.fleet.models import FleetHost

    done = joined("gpu-2")
    status, _ = _post("/api/fleet/host/heartbeat/", report(driver_version="580.65.06"),
                      done.credential)
    assert status == 200
    telemetry = FleetHost.objects.get(name="gpu-2").gpu_telemetry
    assert telemetry["driver_version"] == "580.65.06" and telemetry["available"] is True
    for bad in ("580; rm -rf /", 580, "", "1.2.3.4.5", "x" * 40):
        status, body = _post("/api/fleet/host/heartbeat/", report(driver_version=bad),
                             done.credential)
        assert status == 400 and "driver_version" in body, (bad, status, body)
        assert "digits and dots" in body["driver_version"][0]
    # Refused whole: the row keeps what the last good report said.
    assert FleetHost.objects.get(name="gpu-2").gpu_telemetry["driver_version"] == "580.65.06"


def test_a_join_token_is_not_a_credential() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    services.host_join(token=made.secret, name="gpu-2",
                       facts=services.host_facts_from(report()))
    assert _post("/api/fleet/host/heartbeat/", report(), made.secret)[0] == 401


def test_a_hosts_credential_opens_none_of_the_users_api(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    client = Client()
    for path in ("/api/deployments/", "/api/keys/", "/api/fleet/tokens/", "/api/fleet/hosts/",
                 "/api/models/"):
        for scheme in ("Bearer", "Token"):
            answer = client.get(path, HTTP_AUTHORIZATION=f"{scheme} {done.credential}")
            assert answer.status_code in (401, 403), (path, scheme, answer.status_code)


def test_a_host_writes_events_for_its_own_deployment(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _post(f"/api/fleet/host/deployments/{mine.pk}/events/", {
        "events": [["log", {"stream": "stdout", "text": f"line {i}"}] for i in range(3)],
        "row": {"log_cursor": "1767225600.25"}}, done.credential)
    assert status == 200, body
    texts = [e.payload.get("text") for e in Event.objects.filter(deployment=mine, kind="log")]
    assert texts[-3:] == ["line 0", "line 1", "line 2"]
    assert Event.objects.filter(deployment=mine).order_by("-seq")[0].seq == body["last_seq"]


def test_a_host_cannot_write_another_hosts_deployments_events(live_channel) -> None:  # type: ignore[no-untyped-def]
    mine = joined("gpu-2")
    joined("gpu-3")
    theirs = ready()
    services.placement_assign(deployment=theirs, host_name="gpu-3")
    unplaced = ready(name="second", gpus=[1])
    before = Event.objects.count()
    for target in (theirs.pk, unplaced.pk, 999999):
        status, body = _post(f"/api/fleet/host/deployments/{target}/events/",
                             {"events": [["log", {"stream": "stdout", "text": "forged"}]]},
                             mine.credential)
        assert status == 404 and "placed on it" in body["detail"]
    assert Event.objects.count() == before


def test_a_host_may_not_write_a_status_event_or_the_status(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _post(f"/api/fleet/host/deployments/{mine.pk}/events/",
                         {"events": [["status", {"message": "forged"}]]}, done.credential)
    assert status == 400 and "events" in body
    status, body = _post(f"/api/fleet/host/deployments/{mine.pk}/events/",
                         {"events": [["log", {"text": "x"}]], "row": {"status": "failed"}},
                         done.credential)
    assert status == 400 and "row" in body
    mine.refresh_from_db()
    assert mine.status == "ready"


def test_a_host_reads_its_own_placements_only() -> None:
    mine = joined("gpu-2")
    joined("gpu-3")
    here, there = ready(), ready(name="second", gpus=[1])
    services.placement_assign(deployment=here, host_name="gpu-2")
    services.placement_assign(deployment=there, host_name="gpu-3")
    answer = Client().get("/api/fleet/host/", HTTP_AUTHORIZATION=f"Bearer {mine.credential}")
    assert answer.status_code == 200 and answer.json()["deployments"] == [here.pk]
    [placed] = answer.json()["placements"]
    assert placed["id"] == here.pk and placed["start_token"] == "t" and placed["image"] == "img"
    assert placed["engine_key"] == selectors.engine_key(deployment_id=here.pk, start_token="t")
    assert placed["spec"]["name"] == here.name and answer.json()["instance_id"]


def _step(pk: int, credential: str, **body: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    return _post(f"/api/fleet/host/deployments/{pk}/steps/", dict(body), credential)


FAILED = {"cause": "engine-exited", "summary": "The engine exited.", "fix": "Look at the log.",
          "evidence": {"exit_code": 1}}


def test_a_host_fails_its_engine_with_a_diagnosis_through_the_lifecycle(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _step(mine.pk, done.credential, step="failed", start_token="t",
                         diagnosis=FAILED, message="exited with code 1",
                         last_lines=["Traceback", "RuntimeError: boom"])
    assert status == 200 and body == {"moved": True, "status": "failed"}
    mine.refresh_from_db()
    assert mine.diagnosis["cause"] == "engine-exited" and mine.last_lines[-1] == "RuntimeError: boom"
    assert mine.agent_id == "agent@gpu-2"
    assert mine.events.filter(kind="end").exists()


def test_an_engine_that_died_on_a_host_while_serving_restarts_by_its_policy(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready(restart={"policy": "on-failure", "max_restarts": 1})
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _step(mine.pk, done.credential, step="failed", start_token="t",
                         diagnosis=FAILED)
    assert status == 200 and body["status"] == "starting"
    mine.refresh_from_db()
    assert mine.restarts == 1 and mine.start_token != "t"
    # The old start's steps are refused from now on: its engine is gone.
    status, body = _step(mine.pk, done.credential, step="stopped", start_token="t")
    assert status == 409 and "no longer on that start" in body["detail"]


def test_a_replica_whose_host_came_back_with_its_engine_exited_heals_without_a_policy(
        live_channel, settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENT_SILENT_S = 30
    done = joined("gpu-2")
    first = queued(gpus=[0], replicas=2)
    replica = Deployment.objects.get(replica_of=first)
    dservices.deployment_mark_starting(deployment_id=replica.pk, image="img", start_token="t")
    dservices.deployment_mark_ready(deployment_id=replica.pk)
    assert replica.host == "gpu-2"  # placed on the host it does not use yet
    died = {"cause": "engine-exited", "summary": "The engine container ended with exit code "
            "255 while serving: Docker's code for a container whose process it lost.",
            "fix": "Nothing to fix in the engine.", "evidence": {"exit_code": 255}}
    status, body = _step(replica.pk, done.credential, step="failed", start_token="t",
                         diagnosis=died, message="exit code 255")
    assert status == 200 and body["status"] == "starting", body
    replica.refresh_from_db()
    assert replica.run == 2 and replica.restart_not_before is not None
    # Its new run is still this host's to watch: lost again, it reads unknown, not starting.
    assert replica.agent_id == "agent@gpu-2"
    FleetHost.objects.filter(name="gpu-2").update(
        heartbeat_at=timezone.now() - timedelta(seconds=60))
    assert deployment_silence(deployment=replica) is not None


@pytest.mark.parametrize(("body", "field"), [
    ({"step": "serving", "start_token": "t"}, "step"),
    ({"step": "ready"}, "start_token"),
    ({"step": "ready", "start_token": "t", "engine_url": "http://web:8000"}, "engine_url"),
    ({"step": "ready", "start_token": "t", "engine_url": "http://169.254.169.254:80"},
     "engine_url"),
    ({"step": "ready", "start_token": "t", "engine_url": "http://10.0.0.2:30000/x"},
     "engine_url"),
    ({"step": "failed", "start_token": "t", "diagnosis": {"cause": 1}}, "diagnosis"),
    ({"step": "failed", "start_token": "t", "diagnosis": FAILED, "last_lines": "x"},
     "last_lines"),
])
def test_a_bad_step_names_its_field_and_moves_nothing(body, field) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, answer = _step(mine.pk, done.credential, **body)
    assert status == 400 and field in answer
    mine.refresh_from_db()
    assert mine.status == "ready"


def test_the_own_hosts_engine_is_ready_at_its_container_name_and_at_no_other_name() -> None:
    """The panel's own host, joined, runs its engines on the engine network: its ready step
    names the engine container of that start (reached by name), never another name."""
    from appliance.runtime.container_plan import container_name
    from web.deployments.services.installation import instance_id

    first, other = queued(name="first", gpus=[0]), queued(name="other", gpus=[1])
    for row in (first, other):
        dservices.deployment_mark_starting(deployment_id=row.pk, image="img", start_token="t")
    done = joined("gpu-host")  # the rows' host (APPLIANCE_HOST_NAME), now joined
    mine = container_name(str(first.pk), instance_id(), "t")
    for url in ("http://web:8000", f"http://{container_name(str(other.pk), instance_id(), 't')}"
                ":30000", f"http://{mine}:30000/v1", f"http://{mine}"):
        status, answer = _step(first.pk, done.credential, step="ready", start_token="t",
                               engine_url=url)
        assert status == 400 and "engine_url" in answer, url
    status, answer = _step(first.pk, done.credential, step="ready", start_token="t",
                           engine_url=f"http://{mine}:30000")
    assert status == 200 and answer["status"] == "ready", answer
    assert Deployment.objects.get(pk=first.pk).engine_url == f"http://{mine}:30000"
    # A joined host other than the panel's own is never told yes for a name.
    gpu2 = joined("gpu-2")
    services.placement_assign(deployment=other, host_name="gpu-2")
    status, answer = _step(other.pk, gpu2.credential, step="ready", start_token="t",
                           engine_url=f"http://{container_name(str(other.pk), instance_id(), 't')}"
                           ":30000")
    assert status == 400 and "engine_url" in answer


@pytest.mark.parametrize("bad", ['"a\\u0000b"', '"\\ud800"', "NaN"])
def test_a_payload_the_database_cannot_store_is_a_400_and_stores_nothing(bad, live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    before = Event.objects.filter(deployment=mine).count()
    # By hand, so the bad value reaches the panel exactly as a hostile host would send it.
    good = '["log", {"stream": "stdout", "text": "ok"}]'
    body = '{"events": [' + good + ', ["log", {"text": "x", "note": ' + bad + '}]]}'
    answer = Client().post(f"/api/fleet/host/deployments/{mine.pk}/events/", body,
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {done.credential}")
    assert answer.status_code == 400 and "cannot store" in answer.json()["events"][0]
    assert Event.objects.filter(deployment=mine).count() == before


def test_a_placed_engine_is_watched_by_its_hosts_heartbeat(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = queued()
    dservices.deployment_mark_starting(deployment_id=mine.pk, image="img", start_token="s1")
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _step(mine.pk, done.credential, step="loading", start_token="s1")
    assert status == 200 and body == {"moved": True, "status": "loading"}
    mine.refresh_from_db()
    assert deployment_silence(deployment=mine) is None  # the host reported just now
    later = timezone.now() + timedelta(seconds=120)
    silent = deployment_silence(deployment=mine, now=later)
    assert silent is not None and silent.agent_id == "agent@gpu-2"


def _metrics(pk: int, credential: str, **body: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    return _post(f"/api/fleet/host/deployments/{pk}/metrics/",
                 {"start_token": "t", **body}, credential)


def _point(**changes: object) -> dict:  # type: ignore[type-arg]
    return {"t": time.time(), "throughput": 212.5, "running": 3.0, "kv_usage": 0.41,
            "gpus": [[87.0, 61.2, None]], **changes}


STALL = {"id": "stall", "state": "firing", "severity": "warning",
         "summary": "no progress for 300 s", "fix": "look at the log", "evidence": {"s": 300}}


def test_a_hosts_engine_monitor_stores_points_and_alerts_for_its_own_engine(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, body = _metrics(mine.pk, done.credential, points=[_point(), _point()],
                            alerts=[STALL], compact=True)
    assert (status, body) == (200, {"stored": 2})
    stored = MetricPoint.objects.filter(deployment=mine)
    assert stored.count() == 2 and {p.throughput for p in stored} == {212.5}
    mine.refresh_from_db()
    assert mine.latest_metrics["kv_usage"] == 0.41 and list(mine.alerts) == ["stall"]
    assert Event.objects.filter(deployment=mine, kind="alert").count() == 1
    status, _ = _metrics(mine.pk, done.credential, alerts=[{**STALL, "state": "resolved"}])
    mine.refresh_from_db()
    assert status == 200 and mine.alerts == {}


def test_a_host_cannot_store_metrics_for_another_engine_or_another_start(live_channel) -> None:  # type: ignore[no-untyped-def]
    mine = joined("gpu-2")
    joined("gpu-3")
    theirs = ready()
    services.placement_assign(deployment=theirs, host_name="gpu-3")
    unplaced = ready(name="second", gpus=[1])
    for target in (theirs.pk, unplaced.pk, 999999):
        status, body = _metrics(target, mine.credential, points=[_point()], alerts=[STALL])
        assert status == 404 and "placed on it" in body["detail"]
    here = ready(name="third", gpus=[2])
    services.placement_assign(deployment=here, host_name="gpu-2")
    status, body = _post(f"/api/fleet/host/deployments/{here.pk}/metrics/",
                         {"start_token": "an-earlier-start", "points": [_point()]},
                         mine.credential)
    assert status == 409 and "no longer on that start" in body["detail"]
    assert not MetricPoint.objects.exists()
    assert not Deployment.objects.exclude(alerts={}).exists()


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"points": [{"throughput": 1.0}]}, "points", "Unix time t"),
    ({"points": [_point(t=time.time() - 7200)]}, "points", "NTP"),
    ({"points": [_point(throughput="fast")]}, "points", "throughput must be finite"),
    ({"points": [_point(gpus=[["hot"]])]}, "points", "gpus is a list"),
    ({"points": [_point()] * 31}, "points", "up to 30"),
    ({"alerts": [{**STALL, "state": "burning"}]}, "alerts", "state"),
    ({"alerts": [{**STALL, "id": "<script>"}]}, "alerts", "a slug"),
    ({"alerts": [{**STALL, "summary": "x" * 5000}]}, "alerts", "2000 characters"),
    ({"start_token": ""}, "start_token", "start token"),
])
def test_a_bad_metrics_report_names_its_field_and_stores_nothing(body, field, words,  # type: ignore[no-untyped-def]
                                                                 live_channel) -> None:
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, answer = _metrics(mine.pk, done.credential, **body)
    assert status == 400 and words in answer[field][0], answer
    assert not MetricPoint.objects.exists()


# ------------------------------------------------------------ one agent process per host


def _as(session: str, credential: str) -> dict[str, str]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {credential}"}
    return {**headers, "HTTP_X_AGENT_SESSION": session} if session else headers


def _read(credential: str, session: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    answer = Client().get("/api/fleet/host/", **_as(session, credential))
    return answer.status_code, answer.json()


def _write(path: str, body: dict, credential: str, session: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    answer = Client(enforce_csrf_checks=True).post(path, json.dumps(body),
                                                   content_type="application/json",
                                                   **_as(session, credential))
    return answer.status_code, answer.json()


def _lines(pk: int) -> list[str]:
    return [e.payload["text"] for e in Event.objects.filter(deployment_id=pk, kind="log")
            .order_by("seq")]


def test_one_agent_process_writes_for_a_host_until_its_lease_runs_out(
        live_channel, settings) -> None:  # type: ignore[no-untyped-def]
    settings.FLEET_AGENT_LEASE_S = 15
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    events = f"/api/fleet/host/deployments/{mine.pk}/events/"
    writes = {
        events: {"events": [["log", {"stream": "stdout", "text": "from b"}]]},
        f"/api/fleet/host/deployments/{mine.pk}/steps/": {"step": "stopped",
                                                           "start_token": "t"},
        f"/api/fleet/host/deployments/{mine.pk}/metrics/": {"start_token": "t",
                                                             "points": [_point()]},
        f"/api/fleet/host/deployments/{mine.pk}/quiet/": {}}
    assert _read(done.credential, "a")[0] == 200  # process a holds the host
    host = FleetHost.objects.get(name="gpu-2")
    assert host.agent_session == "a" and host.agent_lease_until is not None
    held_until = host.agent_lease_until
    assert 14 <= (held_until - timezone.now()).total_seconds() <= 15
    status, refused = _read(done.credential, "b")
    assert status == 409 and "another agent process of host gpu-2" in refused["detail"]
    for session in ("b", ""):  # another process, or one that sends no session
        for path, body in writes.items():
            status, answer = _write(path, body, done.credential, session)
            assert status == 409 and "holds it until" in answer["detail"], (path, answer)
    mine.refresh_from_db()
    assert mine.status == "ready" and not MetricPoint.objects.exists()
    assert "from b" not in _lines(mine.pk)
    status, _ = _write(events, {"events": [["log", {"stream": "stdout", "text": "from a"}]]},
                       done.credential, "a")
    assert status == 200 and _lines(mine.pk)[-1] == "from a"
    # Renewed only once a third of it is spent: each renewal writes the host's row.
    assert _read(done.credential, "a")[0] == 200
    assert FleetHost.objects.get(name="gpu-2").agent_lease_until == held_until
    FleetHost.objects.filter(name="gpu-2").update(
        agent_lease_until=timezone.now() + timedelta(seconds=9))
    assert _read(done.credential, "a")[0] == 200
    renewed = FleetHost.objects.get(name="gpu-2").agent_lease_until
    assert renewed is not None and (renewed - timezone.now()).total_seconds() > 14
    # Process a stops renewing (killed): b takes the host once the lease has run out, and
    # from then on a's writes are the ones refused.
    FleetHost.objects.filter(name="gpu-2").update(
        agent_lease_until=timezone.now() - timedelta(seconds=1))
    assert _read(done.credential, "b")[0] == 200
    assert FleetHost.objects.get(name="gpu-2").agent_session == "b"
    status, _ = _write(events, {"events": [["log", {"stream": "stdout", "text": "late a"}]]},
                       done.credential, "a")
    assert status == 409 and "late a" not in _lines(mine.pk)
    # b stops and gives the host back: a takes it at once.
    assert _write("/api/fleet/host/release/", {}, done.credential, "b") == (
        200, {"released": True})
    assert _write("/api/fleet/host/release/", {}, done.credential, "b") == (
        200, {"released": True})  # still b's session on the row, ended already
    assert _read(done.credential, "a")[0] == 200
    assert _write("/api/fleet/host/release/", {}, done.credential, "b") == (
        200, {"released": False})


def test_a_session_id_too_long_names_the_header() -> None:
    done = joined("gpu-2")
    status, body = _read(done.credential, "x" * 65)
    assert status == 400 and "X-Agent-Session" in body


def test_an_agent_that_sends_no_session_is_served_as_before() -> None:
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    assert _read(done.credential, "")[0] == 200
    assert FleetHost.objects.get(name="gpu-2").agent_lease_until is None  # claims nothing
    status, body = _write(f"/api/fleet/host/deployments/{mine.pk}/events/",
                          {"events": [["log", {"stream": "stdout", "text": "old agent"}]],
                           "row": {"log_cursor": "5:1"}}, done.credential, "")
    assert status == 200 and body["stored"] is True and _lines(mine.pk)[-1] == "old agent"


def test_a_batch_of_another_start_is_refused_and_stores_nothing(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    before = Event.objects.filter(deployment=mine).count()
    status, body = _post(f"/api/fleet/host/deployments/{mine.pk}/events/", {
        "events": [["log", {"stream": "stdout", "text": "an earlier engine's"}]],
        "row": {"log_cursor": "9:1"}, "start_token": "an-earlier-start"}, done.credential)
    assert status == 409 and "no longer on that start" in body["detail"]
    mine.refresh_from_db()
    assert Event.objects.filter(deployment=mine).count() == before and mine.log_cursor == ""


@pytest.mark.parametrize(("body", "field"), [
    ({"start_token": ""}, "start_token"),
    ({"start_token": 7}, "start_token"),
    ({"after": 7}, "after"),
    ({"after": "1" * 41}, "after"),
])
def test_a_bad_start_token_or_after_names_its_field(body, field) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    status, answer = _post(f"/api/fleet/host/deployments/{mine.pk}/events/", {
        "events": [["log", {"stream": "stdout", "text": "x"}]], **body}, done.credential)
    assert status == 400 and field in answer, answer


def test_a_batch_sent_again_after_its_answer_was_lost_is_stored_once(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    path = f"/api/fleet/host/deployments/{mine.pk}/events/"

    def batch(after: str, cursor: str, *texts: str) -> tuple[int, dict]:  # type: ignore[type-arg]
        return _post(path, {"events": [["log", {"stream": "stdout", "text": t}] for t in texts],
                            "row": {"log_cursor": cursor}, "start_token": "t",
                            "after": after}, done.credential)

    status, first = batch("", "100:1", "one", "two")
    assert status == 200 and first["stored"] is True
    # The same batch again (its answer lost after the commit): not stored, the row's cursor
    # in the answer, which is the batch's own (the agent goes on after it).
    status, again = batch("", "100:1", "one", "two")
    assert status == 200 and again == {"stored": False, "log_cursor": "100:1",
                                       "last_seq": first["last_seq"]}
    status, _ = batch("100:1", "100:1#1", "three")  # a batch that moves no line
    assert status == 200
    assert batch("100:1", "100:1#1", "three")[1]["stored"] is False
    assert batch("100:1#1", "200:1", "four")[1]["stored"] is True
    assert _lines(mine.pk)[-4:] == ["one", "two", "three", "four"]
    assert _lines(mine.pk).count("one") == 1
    mine.refresh_from_db()
    assert mine.log_cursor == "200:1"


def test_the_heartbeat_period_is_the_panels_setting_and_the_agent_follows_it(settings) -> None:  # type: ignore[no-untyped-def]
    from appliance.runtime.remote_agent import heartbeat_interval

    settings.FLEET_HEARTBEAT_S = 2
    status, body = _join()
    assert status == 201 and body["heartbeat_s"] == 2
    status, me = _read(body["credential"], "a")
    assert status == 200 and me["heartbeat_s"] == 2
    assert heartbeat_interval(me, 10.0) == 2


def test_a_batch_of_several_statements_is_stored_whole_or_not_at_all_by_its_cursor(
        live_channel) -> None:  # type: ignore[no-untyped-def]
    """Over CHUNK_EVENTS events go as several statements in one transaction: each one
    checks the cursor, and only the last moves it."""
    from web.deployments.services.events import CHUNK_EVENTS

    done = joined("gpu-2")
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    texts = [f"line {i}" for i in range(2 * CHUNK_EVENTS + 500)]
    body = {"events": [["log", {"stream": "stdout", "text": t}] for t in texts],
            "row": {"log_cursor": "300:1"}, "start_token": "t"}
    status, answer = _post(f"/api/fleet/host/deployments/{mine.pk}/events/",
                           {**body, "after": "not-the-rows"}, done.credential)
    assert status == 200 and answer["stored"] is False and answer["log_cursor"] == ""
    assert _lines(mine.pk) == []
    status, answer = _post(f"/api/fleet/host/deployments/{mine.pk}/events/",
                           {**body, "after": ""}, done.credential)
    assert status == 200 and answer["stored"] is True and _lines(mine.pk) == texts
    status, answer = _post(f"/api/fleet/host/deployments/{mine.pk}/events/",
                           {**body, "after": ""}, done.credential)
    assert answer == {"stored": False, "log_cursor": "300:1", "last_seq": answer["last_seq"]}
    assert len(_lines(mine.pk)) == len(texts)
