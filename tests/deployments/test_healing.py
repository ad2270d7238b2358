"""Replicas heal: a replica or a companion whose engine died while serving (or whose host
came back with it exited) is started again with the doubling wait, whatever the spec's
restart policy, and however often; a deployment of its own keeps its policy. A failure
shows the engine's stored lines where its agent sent none, and never sends the reader to
lines below when there are none."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from appliance.logs.appliance_causes import (
    ENGINE_EXITED,
    HOST_RESTART_FIX,
    NO_LINES_FIX,
    exit_diagnosis,
    exit_message,
)
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services import lifecycle

pytestmark = pytest.mark.django_db
S = DeploymentStatus
DIED = exit_diagnosis(255, exit_message(255, "while serving"), {"exit_code": 255})


def _ready(pk: int, token: str) -> Deployment:
    assert services.deployment_mark_starting(deployment_id=pk, image="img", start_token=token)
    assert services.deployment_mark_ready(deployment_id=pk, engine_url="http://e:30000")
    return Deployment.objects.get(pk=pk)


def test_exit_code_255_is_dockers_lost_process_not_a_signal_and_real_signals_are_named() -> None:
    lost = exit_message(255, "while serving")
    assert "signal" not in lost.replace("no signal", "")
    assert "exit code 255" in lost and "restarted" in lost
    assert exit_message(137, "while serving") == \
        "the engine was killed by signal 9 (SIGKILL) while serving"
    assert exit_message(143, "before it was ready").startswith(
        "the engine was killed by signal 15 (SIGTERM)")
    assert exit_message(200, "while serving") == \
        "the engine container exited with code 200 while serving"
    assert exit_message(1, "while serving") == \
        "the engine container exited with code 1 while serving"
    assert DIED.cause == ENGINE_EXITED.id and DIED.fix == HOST_RESTART_FIX
    assert "last lines below" not in DIED.fix
    assert exit_diagnosis(1, "x", {}).fix == ENGINE_EXITED.fix


def test_a_replica_that_died_is_started_again_whatever_its_policy_with_a_doubling_wait(
        settings: Any) -> None:
    settings.RESTART_BACKOFF_S, settings.RESTART_BACKOFF_MAX_S = 10, 40
    first = deploying.deployment_create(data=spec(replicas=2), confirm_warnings=True)
    replica = Deployment.objects.get(replica_of=first)
    assert (first.spec.get("restart") or {}).get("policy", "never") == "never"
    token = "t1"
    waits = []
    for n in range(1, 5):  # past the policy's default of 5 would be no different
        _ready(replica.pk, token) if n == 1 else services.deployment_mark_ready(
            deployment_id=replica.pk)
        before = timezone.now()
        assert lifecycle.deployment_restart_after_death(
            deployment_id=replica.pk, start_token=token, diagnosis=DIED,
            message=exit_message(255, "while serving"))
        row = Deployment.objects.get(pk=replica.pk)
        assert row.status == S.STARTING and row.run == n + 1 and row.start_token != token
        waits.append(round((row.restart_not_before - before).total_seconds()))
        token = row.start_token
    assert waits == [10, 20, 40, 40]
    marker = Deployment.objects.get(pk=replica.pk).events.order_by("-seq").first()
    assert marker is not None
    assert "a replica is brought back whatever the restart policy" in marker.payload["message"]
    # Replica 0 heals too, while it has replicas.
    _ready(first.pk, "r0")
    assert lifecycle.deployment_restart_after_death(
        deployment_id=first.pk, start_token="r0", diagnosis=DIED, message="it died")


def test_a_companion_heals_and_a_deployment_of_its_own_keeps_its_policy() -> None:
    companion = deploying.deployment_create(data=spec(name="base", gpus=[0]),
                                            confirm_warnings=True)
    alone = deploying.deployment_create(data=spec(name="alone", gpus=[1]),
                                        confirm_warnings=True)
    _ready(companion.pk, "c1")
    _ready(alone.pk, "a1")
    # Nobody names "base" yet: it is a deployment of its own, no policy, not restarted.
    assert lifecycle.deployment_serves_a_set(deployment=companion) == ""
    deploying.deployment_create(data=spec(name="ddt", gpus=[2], companion="base"),
                                confirm_warnings=True)
    assert lifecycle.deployment_serves_a_set(deployment=companion) == "a companion"
    assert lifecycle.deployment_restart_after_death(
        deployment_id=companion.pk, start_token="c1", diagnosis=DIED, message="it died")
    assert not lifecycle.deployment_restart_after_death(
        deployment_id=alone.pk, start_token="a1", diagnosis=DIED, message="it died")


def test_a_failure_without_lines_shows_the_stored_ones_or_says_there_are_none() -> None:
    printed = deploying.deployment_create(data=spec(name="printed", gpus=[0]),
                                          confirm_warnings=True)
    silent = deploying.deployment_create(data=spec(name="silent", gpus=[1]),
                                         confirm_warnings=True)
    _ready(printed.pk, "p")
    _ready(silent.pk, "s")
    services.events_append(deployment_id=printed.pk, events=[
        ("log", {"text": f"Decode batch. line {i}"}) for i in range(70)])
    unrecognised = ENGINE_EXITED.worded(summary="the engine exited with code 1")
    for row in (printed, silent):
        assert services.deployment_mark_failed(deployment_id=row.pk, diagnosis=unrecognised,
                                               last_lines=[])
    shown = Deployment.objects.get(pk=printed.pk)
    assert shown.last_lines == [f"Decode batch. line {i}" for i in range(10, 70)]
    assert shown.diagnosis["fix"] == ENGINE_EXITED.fix  # "Read the engine's last lines below"
    bare = Deployment.objects.get(pk=silent.pk)
    assert bare.last_lines == [] and bare.diagnosis["fix"] == NO_LINES_FIX
    assert "below" not in bare.diagnosis["fix"]
