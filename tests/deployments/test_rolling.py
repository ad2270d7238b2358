"""Rolling changes (services/rolling.py) on the real database and Redis: Restart and Redeploy
of a deployment with replicas go one replica at a time (drain, the in-flight requests or the
timeout, stop, the new run, ready, back in the rotation); a new run that fails halts the
roll with its cause while the replicas not reached keep serving; one replica is as before.

The engine's own moves (stopped by the agent, started by the build worker, ready) are made
here with the lifecycle services, as those processes make them; tests/worker/test_rolling.py
runs the same rolls with the real agent, worker and test engine containers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from appliance.logs.appliance_causes import ENGINE_EXITED
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.inflight import inflight_key
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services import rolling
from web.fleet.leases import gpu_leases_acquire

pytestmark = pytest.mark.django_db
S = DeploymentStatus


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    """The Redis the gateway counts in-flight requests in (this suite's database)."""
    made = redis.Redis.from_url(settings.REDIS_URL)
    yield made
    for key in made.scan_iter(inflight_key(deployment_id=0).rsplit(":", 1)[0] + ":*"):
        made.delete(key)


@pytest.fixture(autouse=True)
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait for the gateway's routing tables to see a drain, on a clock the tests skip.
    monkeypatch.setattr(rolling, "DRAIN_GRACE_S", 0.0)


def _ready(pk: int, token: str) -> None:
    assert services.deployment_mark_starting(deployment_id=pk, image="img", start_token=token)
    assert services.deployment_mark_ready(deployment_id=pk, engine_url=f"http://e{pk}:30000")


def _deployment(replicas: int) -> list[Deployment]:
    """Replica 0 through the create service, the others as rows (as the replicas' create
    code makes them), each on a GPU of its own, all serving."""
    primary = deploying.deployment_create(data=spec(), confirm_warnings=True)
    rows = [primary]
    for i in range(1, replicas):
        row = Deployment.objects.create(
            name=primary.name, spec={**primary.spec, "gpus": [i]}, recipe=primary.recipe,
            algorithm=primary.algorithm, gpus=[i], replica_of=primary, replica_index=i)
        gpu_leases_acquire(deployment=row)
        rows.append(row)
    for row in rows:
        _ready(row.pk, f"old{row.pk}")
    return [Deployment.objects.get(pk=r.pk) for r in rows]


def _rows(rows: list[Deployment]) -> list[Deployment]:
    return [Deployment.objects.get(pk=r.pk) for r in rows]


def _agent_and_worker(rows: list[Deployment], *, fail: int | None = None) -> None:
    """What the agent and the build worker would do next to each row: stop a stopping one,
    start a queued one (failing replica `fail`'s start)."""
    for row in _rows(rows):
        if row.status == S.STOPPING:
            assert services.deployment_mark_stopped(deployment_id=row.pk)
        elif row.status == S.QUEUED and row.replica_index == fail:
            assert services.deployment_mark_starting(deployment_id=row.pk, image="img2",
                                                     start_token="bad")
            assert services.deployment_mark_failed(
                deployment_id=row.pk, last_lines=["Killed"],
                diagnosis=ENGINE_EXITED.worded(summary="the new engine exited while loading"))
        elif row.status == S.QUEUED:
            _ready(row.pk, f"new{row.pk}r{row.run}")


def _serving(row: Deployment) -> bool:
    return row.status == S.READY and not row.draining


def _roll(rows: list[Deployment], client: redis.Redis, *, fail: int | None = None,
          ) -> list[list[tuple[str, bool]]]:
    """Tick the roll to its end, the agent and worker acting between ticks; every state
    seen, as (status, draining) per replica."""
    seen = []
    for _ in range(60):
        rolling.rolling_step(deployment_id=rows[0].pk, client=client)
        seen.append([(r.status, r.draining) for r in _rows(rows)])
        if Deployment.objects.get(pk=rows[0].pk).rolling["state"] != rolling.ROLLING:
            return seen
        _agent_and_worker(rows, fail=fail)
        seen.append([(r.status, r.draining) for r in _rows(rows)])
    pytest.fail(f"the roll did not end: {Deployment.objects.get(pk=rows[0].pk).rolling}")


def test_a_rolling_restart_takes_one_replica_at_a_time_and_undrains_each_after_ready(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(3)
    runs_before = [r.run for r in rows]
    started = services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    assert started.rolling["text"] == "rolling restart: replica 1 of 3: draining (in-flight " \
                                      "requests finishing)"
    seen = _roll(rows, client)

    for state in seen:  # never two replicas out at once; out means drained or not ready
        assert sum(1 for status, draining in state
                   if draining or status != S.READY) <= 1, state
        assert all(status == S.READY for status, draining in state if not draining), state
    rows = _rows(rows)
    assert [r.run for r in rows] == [n + 1 for n in runs_before]
    assert all(_serving(r) for r in rows)
    assert rows[0].rolling["state"] == rolling.DONE
    assert rows[0].rolling["text"] == "rolling restart done: 3 of 3 replicas on their new run"
    # Each replica's turn in the log, in order: drained, stopping, queued, ready, then the next.
    notes = [e.payload["message"] for e in rows[0].events.filter(
        kind="status", payload__has_key="rolling").order_by("seq")]
    turns = [n.split(": ", 1)[0] for n in notes[1:]]
    assert turns == [f"rolling restart, replica {i} of 3" for i in (1, 1, 1, 1, 2, 2, 2, 2,
                                                                    3, 3, 3, 3)]
    assert [n.split(": ", 1)[1].split(" ")[0] for n in notes[1:5]] == [
        "drained,", "stopping", "run", "ready"]


def test_the_drain_waits_while_the_gateway_counts_requests_in_flight(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(2)
    services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    client.set(inflight_key(deployment_id=rows[0].pk), 2)
    for _ in range(3):
        rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    first = Deployment.objects.get(pk=rows[0].pk)
    assert (first.status, first.draining) == (S.READY, True)
    assert first.rolling["text"] == "rolling restart: replica 1 of 2: draining (2 requests " \
                                    "in flight)"
    client.set(inflight_key(deployment_id=rows[0].pk), 0)  # the last request has finished
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert Deployment.objects.get(pk=rows[0].pk).status == S.STOPPING
    assert Deployment.objects.get(pk=rows[1].pk).status == S.READY


def test_the_drain_stops_waiting_once_its_timeout_has_passed(
        operator: Any, client: redis.Redis, settings: Any) -> None:
    settings.ROLL_DRAIN_TIMEOUT_S = 0
    rows = _deployment(2)
    client.set(inflight_key(deployment_id=rows[0].pk), 5)  # a request that never finishes
    services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert Deployment.objects.get(pk=rows[0].pk).status == S.STOPPING


def test_a_replica_whose_new_run_fails_halts_the_roll_and_the_others_keep_serving(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(3)
    new = spec(engine__cuda_graph_max_bs=8)
    deploying.deployment_redeploy(deployment_id=rows[0].pk, data=new, user=operator,
                                  confirm_warnings=True)
    _roll(rows, client, fail=1)

    first, second, third = _rows(rows)
    assert first.rolling["state"] == rolling.HALTED
    assert first.rolling["text"] == (
        "rolling redeploy halted at replica 2 of 3: its new run 2 did not become ready: the "
        "new engine exited while loading; the replicas not reached keep serving their "
        "earlier run")
    assert _serving(first) and first.spec["engine"]["cuda_graph_max_bs"] == 8
    assert (second.status, second.draining) == (S.FAILED, False)
    assert second.spec["engine"]["cuda_graph_max_bs"] == 8 and second.gpus == [1]
    # Replica 3 was never touched: its first run, its old spec, in the rotation.
    assert _serving(third) and third.run == 1 and third.start_token == f"old{third.pk}"
    assert third.spec == rows[2].spec and third.spec["engine"]["cuda_graph_max_bs"] != 8
    # A halted roll takes no more steps, and a new Restart may begin again.
    assert not rolling.rolling_step(deployment_id=first.pk, client=client)
    assert services.deployment_restart(deployment_id=first.pk).rolling["state"] == "rolling"


def test_a_redeploy_gives_each_replica_the_new_spec_on_its_own_gpus(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(2)
    deploying.deployment_redeploy(deployment_id=rows[0].pk, data=spec(engine__cuda_graph_max_bs=8),
                                  user=operator, confirm_warnings=True)
    _roll(rows, client)
    first, second = _rows(rows)
    assert [r.spec["engine"]["cuda_graph_max_bs"] for r in (first, second)] == [8, 8]
    assert (first.spec["gpus"], second.spec["gpus"]) == ([0], [1])
    assert set(second.gpu_leases.values_list("gpu_index", flat=True)) == {1}


def test_a_redeploy_that_changes_the_replicas_gpus_or_name_is_refused_naming_it(
        operator: Any) -> None:
    rows = _deployment(2)
    with pytest.raises(services.DeploymentInputError) as gpus:
        deploying.deployment_redeploy(deployment_id=rows[0].pk, data=spec(gpus=[3]),
                                      confirm_warnings=True)
    assert "keeps each replica's GPUs" in gpus.value.errors["gpus"][0]
    with pytest.raises(services.DeploymentInputError) as name:
        deploying.deployment_redeploy(deployment_id=rows[0].pk, data=spec(name="other"),
                                      confirm_warnings=True)
    assert "keeps the name" in name.value.errors["spec"][0]
    assert Deployment.objects.get(pk=rows[0].pk).rolling == {}


def test_a_second_roll_is_refused_while_one_is_under_way_and_stop_ends_it(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(2)
    services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert Deployment.objects.get(pk=rows[0].pk).draining
    with pytest.raises(services.DeploymentInputError) as again:
        services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    assert again.value.errors["status"][0].startswith("rolling restart: replica 1 of 2")
    services.deployment_stop(deployment_id=rows[0].pk)
    first = Deployment.objects.get(pk=rows[0].pk)
    assert first.rolling["state"] == rolling.ENDED and "Stop was pressed" in first.rolling["text"]
    assert not rolling.rolling_step(deployment_id=first.pk, client=client)
    assert not first.draining  # stopping by Stop now, not held out by an ended roll
    # Stop on replica 0 stops the whole deployment, its replica rows with it.
    assert Deployment.objects.get(pk=rows[1].pk).status == S.STOPPING


def test_one_replica_restarts_and_redeploys_as_before(operator: Any) -> None:
    (row,) = _deployment(1)
    with pytest.raises(services.DeploymentInputError) as running:
        services.deployment_restart(deployment_id=row.pk, user=operator)
    assert "Stop it first" in running.value.errors["status"][0]
    with pytest.raises(services.DeploymentInputError):
        deploying.deployment_redeploy(deployment_id=row.pk, data=spec(), confirm_warnings=True)
    services.deployment_stop(deployment_id=row.pk)
    assert services.deployment_mark_stopped(deployment_id=row.pk)
    restarted = services.deployment_restart(deployment_id=row.pk, user=operator)
    assert (restarted.status, restarted.run, restarted.rolling) == (S.QUEUED, 2, {})
    services.deployment_stop(deployment_id=row.pk)  # queued: stopped at once
    redeployed = deploying.deployment_redeploy(
        deployment_id=row.pk, data=spec(gpus=[2], engine__cuda_graph_max_bs=8),
        user=operator, confirm_warnings=True)
    assert (redeployed.status, redeployed.run, redeployed.gpus) == (S.QUEUED, 3, [2])
    assert redeployed.spec["engine"]["cuda_graph_max_bs"] == 8 and redeployed.rolling == {}
    assert set(redeployed.gpu_leases.values_list("gpu_index", flat=True)) == {2}


def test_the_api_redeploys_and_shows_how_far_the_roll_is(
        operator: Any, token_for: Any, client: redis.Redis) -> None:
    rows = _deployment(2)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(operator)}")
    answer = api.post(f"/api/deployments/{rows[0].pk}/redeploy/",
                      {"spec": spec(engine__cuda_graph_max_bs=8), "confirm_warnings": True},
                      format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["rolling"]["state"] == "rolling"
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    detail = api.get(f"/api/deployments/{rows[0].pk}/").json()
    assert detail["rolling"]["text"] == "rolling redeploy: replica 1 of 2: stopping"
    refused = api.post(f"/api/deployments/{rows[0].pk}/redeploy/", {"spec": spec(gpus=[5])},
                       format="json")
    assert refused.status_code == 400 and "gpus" in refused.json()


def test_the_page_offers_a_rolling_restart_while_serving_and_shows_the_roll(
        operator: Any, client: redis.Redis) -> None:
    rows = _deployment(3)
    browser = Client()
    browser.force_login(operator)
    page = browser.get(f"/deployments/{rows[0].pk}/").content.decode()
    link = page.split('id="restart"', 1)[1].split("</a>", 1)[0]
    assert "hidden" not in link and link.endswith(">Rolling restart…")
    # It asks first: the page, and a POST without the confirmation, change nothing.
    asked = browser.get(f"/deployments/{rows[0].pk}/restart/").content.decode()
    assert "Rolling restart of kimi-ddtree" in asked and "Each of its 3 replicas" in asked
    unconfirmed = browser.post(f"/deployments/{rows[0].pk}/restart/")
    assert unconfirmed.status_code == 200 and b'id="confirm-restart"' in unconfirmed.content
    assert not Deployment.objects.get(pk=rows[0].pk).rolling
    answer = browser.post(f"/deployments/{rows[0].pk}/restart/", {"confirm": "yes"},
                          follow=True)
    assert "rolling restart: replica 1 of 3: draining" in answer.content.decode()
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    page = browser.get(f"/deployments/{rows[0].pk}/").content.decode()
    shown = page.split('id="rolling"', 1)[1].split("</p>", 1)[0]
    assert 'data-state="rolling"' in shown and "replica 1 of 3: stopping" in shown


def test_the_redeploy_form_rolls_the_deployment_on_its_new_spec(operator: Any) -> None:
    rows = _deployment(2)
    browser = Client()
    browser.force_login(operator)
    detail = browser.get(f"/deployments/{rows[0].pk}/").content.decode()
    assert f"?from={rows[0].pk}&amp;redeploy=1" in detail
    url = f"/deployments/new/?from={rows[0].pk}&redeploy=1"
    page = browser.get(url)
    html = page.content.decode()
    assert f"Redeploy #{rows[0].pk}" in html and 'id="deploy">Redeploy</button>' in html
    initial = page.context["form"].initial
    data = {k: v for k, v in initial.items() if v is not None and v is not False}
    data["extra_args"] = f"{data.get('extra_args', '')}\n--cuda-graph-max-bs 8".strip()
    answer = browser.post(url, {**data, "confirm_warnings": "on"}, follow=True)
    assert answer.redirect_chain[-1][0] == f"/deployments/{rows[0].pk}/", answer.content[-3000:]
    assert "rolling redeploy: replica 1 of 2: draining" in answer.content.decode()
    assert Deployment.objects.filter(name=rows[0].name).count() == 2  # no new deployment
    assert Deployment.objects.get(pk=rows[0].pk).rolling["columns"]["spec"]["engine"][
        "cuda_graph_max_bs"] == 8


def test_a_new_run_whose_message_was_lost_is_sent_again_once(
        operator: Any, client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    """The roller (in the agent) sends a replica's new run after its transaction commits; an
    agent killed in between leaves it queued with no message (tests/worker/test_rolling.py's
    kill, as CI met it). The roll sends it again once, after ROLL_RESEND_S, while no worker
    has it; a run a worker builds is left alone."""
    # The wait before a resend is not yet over (whatever the machine's load), then over.
    monkeypatch.setattr(rolling, "ROLL_RESEND_S", 3600)
    rows = _deployment(2)
    services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    for _ in range(3):  # drained, stopped, and its new run queued
        rolling.rolling_step(deployment_id=rows[0].pk, client=client)
        if _rows(rows)[0].status == S.STOPPING:
            _agent_and_worker([rows[0]])
    assert _rows(rows)[0].status == S.QUEUED
    assert Deployment.objects.get(pk=rows[0].pk).rolling["step"] == rolling.STARTING
    with django_capture_on_commit_callbacks() as sent:  # the message lost: none goes out
        assert not rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert not _tasks(sent)
    Deployment.objects.filter(pk=rows[0].pk).update(build_owner="a-live-worker")
    monkeypatch.setattr(rolling, "ROLL_RESEND_S", 0)
    with django_capture_on_commit_callbacks() as sent:
        assert not rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert not _tasks(sent)  # a worker has it
    Deployment.objects.filter(pk=rows[0].pk).update(build_owner="")
    with django_capture_on_commit_callbacks() as sent:
        assert rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert len(_tasks(sent)) == 1
    roll = Deployment.objects.get(pk=rows[0].pk).rolling
    assert roll["resent"] and roll["step"] == rolling.STARTING
    with django_capture_on_commit_callbacks() as sent:  # once per run
        assert not rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert not _tasks(sent)
    _agent_and_worker(rows)
    rolling.rolling_step(deployment_id=rows[0].pk, client=client)
    assert Deployment.objects.get(pk=rows[0].pk).rolling["at"] == 1


def _tasks(callbacks: list[Any]) -> list[Any]:
    """The Celery sends among a transaction's on-commit callbacks (web/tasks.py's)."""
    return [c for c in callbacks if c.__qualname__.startswith("_send_on_commit.")]


def test_a_roll_with_no_panel_loop_says_it_waits_for_one_on_the_page_and_its_poll(
        operator: Any, client: redis.Redis) -> None:
    """No rolling_tick for ROLLER_SILENT_S (the compose service `loop` is not running): the
    roll's text says so on the page and in the page's poll; a tick takes the words away."""
    rows = _deployment(2)
    services.deployment_restart(deployment_id=rows[0].pk, user=operator)
    client.delete(rolling.roller_beat_key())
    web = Client()
    web.force_login(operator)
    page = web.get(f"/deployments/{rows[0].pk}/").content.decode()
    polled = web.get(f"/deployments/{rows[0].pk}/agent/").json()["rolling"]
    assert "no panel loop has taken a step" in page and "compose service `loop`" in page
    assert polled["waiting_for_loop"] and "no panel loop" in polled["text"]
    assert "no panel loop" not in Deployment.objects.get(pk=rows[0].pk).rolling["text"]

    rolling.rolling_tick(client=client)  # a loop's tick: the beat, with its expiry
    assert 0 < client.ttl(rolling.roller_beat_key()) <= rolling.ROLLER_SILENT_S
    polled = web.get(f"/deployments/{rows[0].pk}/agent/").json()["rolling"]
    assert "waiting_for_loop" not in polled and "no panel loop" not in polled["text"]
    assert "no panel loop" not in web.get(f"/deployments/{rows[0].pk}/").content.decode()
