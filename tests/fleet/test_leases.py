"""GPU leases: two live deployments never hold the same GPU of a host; the database decides.
web/deployments takes and gives them back through the hook web/fleet registers at start."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from appliance.logs.catalogue import CATALOGUE
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.services import gpus
from web.fleet import leases
from web.fleet.models import GpuLease


def _create(**changes: Any) -> Deployment:
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def _held() -> dict[int, int]:
    return dict(GpuLease.objects.values_list("gpu_index", "deployment_id"))


@pytest.mark.django_db
def test_a_deployment_holds_its_gpus_from_creation() -> None:
    deployment = _create(gpus=[0, 1, 2, 3])
    assert _held() == {0: deployment.pk, 1: deployment.pk, 2: deployment.pk, 3: deployment.pk}
    assert set(GpuLease.objects.values_list("host", flat=True)) == {"gpu-host"}


@pytest.mark.django_db
def test_it_refuses_a_gpu_held_by_another_deployment_naming_both() -> None:
    first = _create(gpus=[0, 1, 2, 3])
    with pytest.raises(services.DeploymentInputError) as caught:
        _create(name="second", gpus=[3, 4])
    text = " ".join(caught.value.errors["gpus"])
    assert f"GPU 3 on host gpu-host is held by deployment #{first.pk} 'kimi-ddtree' (queued)" \
        in text and "choose other GPUs" in text
    # All or nothing: the refused one left no row and took not even its free GPU 4.
    assert Deployment.objects.count() == 1 and 4 not in _held()


@pytest.mark.django_db
@pytest.mark.parametrize("end", ["stop", "fail"])
def test_a_deployment_that_ends_gives_its_gpus_back(end: str) -> None:
    first = _create(gpus=[0, 1])
    services.deployment_mark_starting(deployment_id=first.pk, image="img")
    if end == "stop":
        services.deployment_mark_stopping(deployment_id=first.pk)
        assert _held() == {0: first.pk, 1: first.pk}  # stopping still holds: the engine runs
        services.deployment_mark_stopped(deployment_id=first.pk)
    else:
        services.deployment_mark_failed(deployment_id=first.pk,
                                        diagnosis=CATALOGUE["cuda-oom-load"].diagnosis(),
                                        last_lines=[])
    assert _held() == {}
    second = _create(name="second", gpus=[0, 1])
    assert _held() == {0: second.pk, 1: second.pk}


@pytest.mark.django_db
def test_a_stopped_deployment_takes_its_gpus_again_through_acquire() -> None:
    first = _create(gpus=[2])
    services.deployment_stop(deployment_id=first.pk)  # queued: stopped at once
    other = _create(name="other", gpus=[2])
    first.refresh_from_db()
    with pytest.raises(services.DeploymentInputError) as caught, transaction.atomic():
        leases.gpu_leases_acquire(deployment=first)
    assert f"#{other.pk} 'other'" in caught.value.errors["gpus"][0]
    services.deployment_stop(deployment_id=other.pk)
    leases.gpu_leases_acquire(deployment=first)
    leases.gpu_leases_acquire(deployment=first)  # a retried restart keeps what it holds
    assert _held() == {2: first.pk}


@pytest.mark.django_db
def test_the_api_answers_400_naming_the_gpu_and_its_holder(operator) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    first = client.post("/api/deployments/", {"spec": spec(gpus=[0, 1]), "confirm_warnings": True},
                        content_type="application/json")
    assert first.status_code == 201
    second = client.post("/api/deployments/", {"spec": spec(name="b", gpus=[1]),
                                               "confirm_warnings": True},
                         content_type="application/json")
    assert second.status_code == 400
    assert second.json()["gpus"] == [
        f"GPU 1 on host gpu-host is held by deployment #{first.json()['id']} 'kimi-ddtree' "
        "(queued); stop it or choose other GPUs."]


@pytest.mark.django_db
def test_the_form_shows_the_refusal_beside_the_gpus(operator) -> None:  # type: ignore[no-untyped-def]
    holder = _create(gpus=[0])
    client = Client()
    client.force_login(operator)
    page = client.post("/deployments/new/", {
        "recipe": "kimi-k2.6-ddtree", "name": "again", "model_path": "/models/Kimi-K2.6",
        "drafter_path": "/models/Kimi-K2.6-DFlash", "algorithm": "DDTREE", "block_size": "8",
        "tree_budget": "32", "tp_size": "1", "gpu_ids": "0", "attention_backend": "fa3",
        "self_check": "on", "confirm_warnings": "on"})
    assert page.status_code == 400
    assert page.context["form"].errors["gpu_ids"] == [
        f"GPU 0 on host gpu-host is held by deployment #{holder.pk} 'kimi-ddtree' (queued); "
        "stop it or choose other GPUs."]
    assert "held by deployment" in page.content.decode()


@pytest.mark.django_db
def test_it_refuses_a_gpu_the_host_does_not_have_naming_the_field_and_the_gpus(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 8
    with pytest.raises(services.DeploymentInputError) as caught:
        _create(gpus=[0, 9])
    message = caught.value.errors["gpus"][0]
    assert "GPU ids [9] are not on this host: it has 8 GPUs (ids 0 to 7" in message
    assert "APPLIANCE_GPU_COUNT" in message and GpuLease.objects.count() == 0


# ------------------------------------------------------------- the hook web/deployments calls

ROOT = Path(__file__).resolve().parents[2]


def test_the_fleet_registers_the_leases_when_django_starts() -> None:
    """A process that sets Django up (web, worker, agent, manage.py) has the hook filled by
    FleetConfig.ready, before it runs anything of its own."""
    script = ("import django; django.setup()\n"
              "from web.deployments.services import gpus\n"
              "from web.fleet import leases\n"
              "print(gpus.registered() is leases)\n")
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "web.settings"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"
    assert gpus.registered() is leases


class _Recording:
    """The fleet's leases, each release recorded with the row's status as the releasing
    transaction sees it; `fail_after_release` raises once the rows are deleted."""

    def __init__(self, *, fail_after_release: bool = False) -> None:
        self.released: list[tuple[int, str, int]] = []
        self.fail_after_release = fail_after_release

    def gpu_leases_acquire(self, *, deployment: Deployment) -> None:
        leases.gpu_leases_acquire(deployment=deployment)

    def gpu_leases_release(self, *, deployment_id: int) -> int:
        status = Deployment.objects.values_list("status", flat=True).get(pk=deployment_id)
        count = leases.gpu_leases_release(deployment_id=deployment_id)
        self.released.append((deployment_id, status, count))
        if self.fail_after_release:
            raise RuntimeError("the release's transaction fails after its DELETE")
        return count


@pytest.fixture
def recording() -> Any:
    hook = _Recording()
    gpus.register(hook)
    try:
        yield hook
    finally:
        gpus.register(leases)


def _failed(deployment: Deployment) -> bool:
    return services.deployment_mark_failed(
        deployment_id=deployment.pk, diagnosis=CATALOGUE["cuda-oom-load"].diagnosis(),
        last_lines=[])


@pytest.mark.django_db
def test_a_terminal_move_releases_through_the_hook_after_its_status_update(recording) -> None:  # type: ignore[no-untyped-def]
    first = _create(gpus=[0, 1])
    services.deployment_mark_starting(deployment_id=first.pk, image="img")
    assert recording.released == []  # a move that ends nothing keeps the GPUs
    assert _failed(first)
    # Called once, by the transaction that already moved the row (it reads `failed`).
    assert recording.released == [(first.pk, "failed", 2)] and _held() == {}


@pytest.mark.django_db
def test_a_release_that_fails_rolls_the_terminal_move_back_with_it() -> None:
    first = _create(gpus=[0, 1])
    services.deployment_mark_starting(deployment_id=first.pk, image="img")
    hook = _Recording(fail_after_release=True)
    gpus.register(hook)
    try:
        with pytest.raises(RuntimeError, match="after its DELETE"):
            _failed(first)
    finally:
        gpus.register(leases)
    assert hook.released == [(first.pk, "failed", 2)]
    first.refresh_from_db()  # one transaction: neither the move nor the release stayed
    assert first.status == "starting" and _held() == {0: first.pk, 1: first.pk}


@pytest.mark.django_db
def test_a_rolled_back_terminal_move_keeps_its_leases(recording) -> None:  # type: ignore[no-untyped-def]
    first = _create(gpus=[3])
    services.deployment_mark_starting(deployment_id=first.pk, image="img")
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        services.deployment_mark_stopping(deployment_id=first.pk)
        services.deployment_mark_stopped(deployment_id=first.pk)
        assert _held() == {}
        1 / 0  # noqa: B018  # the caller's transaction fails after the move
    assert recording.released == [(first.pk, "stopped", 1)]
    first.refresh_from_db()
    assert first.status == "starting" and _held() == {3: first.pk}


@pytest.mark.django_db
def test_with_no_leases_registered_a_move_that_takes_or_gives_gpus_fails_loudly(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    first = _create(gpus=[4])
    services.deployment_mark_starting(deployment_id=first.pk, image="img")
    monkeypatch.setattr(gpus, "_registered", None)  # a process where web.fleet never started
    with pytest.raises(gpus.LeasesNotRegistered, match="FleetConfig.ready"):
        _failed(first)
    first.refresh_from_db()
    assert first.status == "starting" and _held() == {4: first.pk}  # nothing moved
    monkeypatch.undo()
    assert _failed(first) and _held() == {}
    monkeypatch.setattr(gpus, "_registered", None)
    with pytest.raises(gpus.LeasesNotRegistered):
        services.deployment_restart(deployment_id=first.pk)
    first.refresh_from_db()
    assert first.status == "failed" and _held() == {}  # not queued without its GPUs


# ------------------------------------------------------------- races, on real connections


def _in_thread(target: Any) -> Any:
    def run() -> None:
        try:
            target()
        finally:
            connection.close()
    return threading.Thread(target=run)


@pytest.mark.django_db(transaction=True)
def test_a_request_racing_an_uncommitted_holder_is_refused_by_the_database() -> None:
    """The holder's INSERT is not committed when the second request checks and inserts: no
    check could see it; the unique index makes the second wait, then refuses it."""
    inserted, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def holder() -> None:
        with transaction.atomic():
            outcome["holder"] = _create(name="holder", gpus=[5]).pk
            inserted.set()
            release.wait(30)

    def racer() -> None:
        try:
            outcome["racer"] = _create(name="racer", gpus=[5]).pk
        except services.DeploymentInputError as exc:
            outcome["racer_error"] = exc.errors["gpus"]

    first = _in_thread(holder)
    first.start()
    assert inserted.wait(30)
    second = _in_thread(racer)
    second.start()
    second.join(2)
    assert second.is_alive(), "the racer should wait on the holder's uncommitted lease"
    release.set()
    first.join(30)
    second.join(30)
    assert "racer" not in outcome
    assert f"#{outcome['holder']} 'holder'" in outcome["racer_error"][0]
    assert list(Deployment.objects.values_list("name", flat=True)) == ["holder"]


@pytest.mark.django_db(transaction=True)
def test_of_four_concurrent_creations_for_one_gpu_exactly_one_wins() -> None:
    start = threading.Barrier(4)
    won: list[int] = []
    refused: list[str] = []

    def attempt(n: int) -> None:
        start.wait(10)
        try:
            won.append(_create(name=f"racer-{n}", gpus=[6, 7]).pk)
        except services.DeploymentInputError as exc:
            refused.extend(exc.errors["gpus"])

    threads = [_in_thread(lambda n=n: attempt(n)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(won) == 1 and len(refused) >= 3
    assert _held() == {6: won[0], 7: won[0]}
    assert Deployment.objects.count() == 1
