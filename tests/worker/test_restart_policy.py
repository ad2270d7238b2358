"""The engine agent and the lifecycle with the real test engine container: the restart policy
starts an engine that died while serving again (a new container, a new run, a count), never
one that failed before ready; Restart brings a stopped deployment back with a new token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

import docker
from appliance.runtime.container_plan import Identity
from tests.conftest_docker import remove_engines, wait_for
from tests.specs import spec
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments import selectors, services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
ON_FAILURE = {"policy": "on-failure", "max_restarts": 1}


@pytest.fixture
def engine(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    env = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4"}
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=env, ENGINE_READY_TIMEOUT_S=90,
                           ENGINE_STOP_TIMEOUT_S=5, RESTART_BACKOFF_S=1,
                           RESTART_BACKOFF_MAX_S=2, ENGINE_TEST_ENV=True):
        yield env
    remove_engines(instance_id())  # this database's engines only, never another run's


def _container_name(pk: int) -> str:
    row = Deployment.objects.get(pk=pk)
    return Identity(str(pk), instance_id(), row.start_token).name


def _deploy(**changes) -> int:  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(**changes), confirm_warnings=True)
    tasks.deploy.apply(args=[deployment.pk]).get()
    return deployment.pk


def _restarted_ready(pk: int, run: int) -> bool:
    row = Deployment.objects.get(pk=pk)
    return row.status == S.READY and row.run == run


def test_an_engine_killed_while_serving_comes_back_once_then_the_deployment_fails(engine, agent):  # type: ignore[no-untyped-def]
    pk = _deploy(restart=ON_FAILURE)
    assert wait_for_status(pk, {S.READY, S.FAILED}, 90) == S.READY
    first = _container_name(pk)
    docker.from_env().containers.get(first).kill()

    wait_for(lambda: _restarted_ready(pk, 2), timeout_s=90, every_s=0.2)
    row = Deployment.objects.get(pk=pk)
    assert row.restarts == 1 and _container_name(pk) != first
    assert docker.from_env().containers.get(_container_name(pk)).status == "running"
    runs = selectors.deployment_runs(deployment=row)
    assert [(r["number"], r["reason"], r["outcome"]) for r in runs] == [
        (1, "deploy", "died"), (2, "policy", "ready")]
    assert "signal 9" in runs[0]["diagnosis"]["summary"] or "killed" in str(runs[0]["diagnosis"])
    # Run 1's lines are kept: its weight loading is still in the log before run 2's marker.
    assert row.events.filter(seq__lt=runs[1]["first_seq"], kind="progress").exists()

    docker.from_env().containers.get(_container_name(pk)).kill()  # the policy is used up now
    assert wait_for_status(pk, {S.FAILED}, 30) == S.FAILED
    assert Deployment.objects.get(pk=pk).restarts == 1


def test_an_engine_that_fails_before_ready_is_not_restarted_by_the_policy(engine, agent):  # type: ignore[no-untyped-def]
    pk = _deploy(restart=ON_FAILURE, env={"TEST_ENGINE_FAIL": "load-exit"})
    assert wait_for_status(pk, {S.READY, S.FAILED}, 90) == S.FAILED
    row = Deployment.objects.get(pk=pk)
    assert row.restarts == 0 and row.run == 1


def test_restart_brings_a_stopped_deployment_back_in_a_new_container(engine, agent):  # type: ignore[no-untyped-def]
    pk = _deploy()
    assert wait_for_status(pk, {S.READY, S.FAILED}, 90) == S.READY
    first_token = Deployment.objects.get(pk=pk).start_token
    services.deployment_stop(deployment_id=pk)
    assert wait_for_status(pk, {S.STOPPED}, 30) == S.STOPPED

    services.deployment_restart(deployment_id=pk)
    tasks.deploy.apply(args=[pk]).get()  # what the queued task does (on_commit sends it)
    assert wait_for_status(pk, {S.READY, S.FAILED}, 90) == S.READY
    row = Deployment.objects.get(pk=pk)
    assert row.run == 2 and row.start_token not in ("", first_token)
    labels = docker.from_env().containers.get(_container_name(pk)).labels
    assert labels["appliance.start-token"] == row.start_token


def test_two_replicas_run_as_two_engines_on_other_gpus_and_restart_each_on_its_own(engine, agent):  # type: ignore[no-untyped-def]
    first = deploying.deployment_create(data=spec(gpus=[0], replicas=2, restart=ON_FAILURE),
                                        confirm_warnings=True)
    rows = [first, *Deployment.objects.filter(replica_of=first)]
    assert [(r.replica_index, r.gpus) for r in rows] == [(0, [0]), (1, [1])]
    for row in rows:
        tasks.deploy.apply(args=[row.pk]).get()
    for row in rows:
        assert wait_for_status(row.pk, {S.READY, S.FAILED}, 90) == S.READY
    rows = [Deployment.objects.get(pk=r.pk) for r in rows]
    names = [_container_name(r.pk) for r in rows]
    assert len(set(names)) == 2 and rows[0].start_token != rows[1].start_token
    assert all(docker.from_env().containers.get(n).status == "running" for n in names)
    assert rows[0].engine_url != rows[1].engine_url

    docker.from_env().containers.get(names[1]).kill()  # replica 1's engine dies
    wait_for(lambda: _restarted_ready(rows[1].pk, 2), timeout_s=90, every_s=0.2)
    zero = Deployment.objects.get(pk=first.pk)
    assert (zero.status, zero.run, zero.restarts) == (S.READY, 1, 0)  # replica 0 untouched
    assert docker.from_env().containers.get(names[0]).status == "running"

    services.deployment_stop(deployment_id=first.pk)  # replica 0's Stop takes both
    for row in rows:
        assert wait_for_status(row.pk, {S.STOPPED}, 30) == S.STOPPED
