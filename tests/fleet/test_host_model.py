"""One host model: every host's report in FleetHost, the panel's own host included, which
has a row no credential opens and is never placed on as a joined host."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from tests.hostrows import host_reported
from tests.rows import queued
from web.fleet import selectors, services
from web.fleet.models import FleetHost, Placement, unjoined_credential

from .hosts import joined

pytestmark = pytest.mark.django_db

copy_hosts = importlib.import_module("web.fleet.migrations.0005_host_reports_copy").copy_hosts


@pytest.fixture
def old() -> Iterator[Any]:
    """The models as the copy migration runs among them, with deployments.Host's table made
    again for the test (its transaction drops it after)."""
    state = MigrationLoader(connection).project_state(
        [("fleet", "0004_host_reports"), ("deployments", "0017_gpulease_to_fleet")])
    with connection.schema_editor() as editor:
        editor.create_model(state.apps.get_model("deployments", "Host"))
    yield state.apps

TELEMETRY = {"available": True, "reason": "",
             "gpus": [{"index": i, "name": "NVIDIA H100", "uuid": f"GPU-{i}",
                       "memory_total_gb": 80.0, "utilization_pct": 3} for i in range(2)]}


def test_the_migration_makes_a_host_row_for_each_report_with_a_credential_nothing_opens(old) -> None:  # type: ignore[no-untyped-def]
    Host = old.get_model("deployments", "Host")  # noqa: N806
    now = timezone.now()
    Host.objects.create(name="gpu-host", agent_id="agent@gpu-host", heartbeat_at=now,
                        docker={"nvidia": True}, gpu_telemetry=TELEMETRY,
                        secret_names=["HF_TOKEN"], foreign_containers=[{"name": "stray"}])
    Host.objects.create(name="old-box", agent_id="agent@old-box",
                        heartbeat_at=now - timedelta(days=3),
                        gpu_telemetry={"available": False, "reason": "no NVML", "gpus": []})
    copy_hosts(old, None)
    own, old = FleetHost.objects.get(name="gpu-host"), FleetHost.objects.get(name="old-box")
    assert (own.heartbeat_at, own.docker, own.agent_id) == (now, {"nvidia": True},
                                                           "agent@gpu-host")
    assert own.gpu_telemetry == TELEMETRY and own.secret_names == ["HF_TOKEN"]
    assert own.foreign_containers == [{"name": "stray"}]
    # Its GPUs as a heartbeat's NVML list gives them (the telemetry's live figures left out).
    assert own.gpu_source == "nvml" and own.gpus == [
        {"index": i, "name": "NVIDIA H100", "uuid": f"GPU-{i}", "memory_total_gb": 80.0}
        for i in range(2)]
    assert (old.gpus, old.gpu_source) == ([], "")
    assert not own.is_joined and not old.is_joined
    assert own.credential_digest != old.credential_digest
    assert own.credential_prefix != old.credential_prefix
    # No credential opens either: not even one whose text is the stored digest or prefix.
    for row in (own, old):
        for guess in (row.credential_digest, f"sdh-{row.credential_prefix}",
                      f"sdh-{row.credential_digest}"):
            assert selectors.host_for_credential(credential=guess) is None
    assert set(FleetHost.objects.unjoined().values_list("name", flat=True)) == {"gpu-host",
                                                                               "old-box"}


def test_the_migration_gives_a_joined_host_its_report_and_keeps_its_credential(old) -> None:  # type: ignore[no-untyped-def]
    Host = old.get_model("deployments", "Host")  # noqa: N806
    done = joined("gpu-2")
    Host.objects.create(name="gpu-2", agent_id="agent@gpu-2", heartbeat_at=timezone.now(),
                        gpu_telemetry=TELEMETRY, foreign_containers=[{"name": "stray"}])
    copy_hosts(old, None)
    host = FleetHost.objects.get(name="gpu-2")
    assert host.is_joined and selectors.host_for_credential(credential=done.credential) == host
    assert host.gpu_telemetry == TELEMETRY and host.foreign_containers == [{"name": "stray"}]
    assert FleetHost.objects.count() == 1


def test_the_own_hosts_row_is_placed_on_as_the_panels_own_not_a_joined_host() -> None:
    FleetHost.objects.create(name="gpu-host", credential_made_at=timezone.now(),
                             heartbeat_at=timezone.now(), docker={"nvidia": True},
                             **unjoined_credential())
    made = queued(gpus=[0])
    assert made.host == "gpu-host"
    own = FleetHost.objects.get(name="gpu-host")
    assert list(Placement.objects.values_list("deployment_id", "host")) == [(made.pk, own.pk)]
    assert not own.is_joined and FleetHost.objects.count() == 1  # the row it had, kept
    assert "this panel's host" in made.placement_reason
    rows = {r.name: r for r in selectors.host_rows()}
    assert set(rows) <= {"gpu-host"} and all(not r.joined for r in rows.values())
    for change in (lambda: services.host_set_draining(name="gpu-host", draining=True),
                   lambda: services.host_remove(name="gpu-host"),
                   lambda: services.placement_assign(deployment=made, host_name="gpu-host")):
        with pytest.raises(services.NoSuchHost):
            change()


def test_a_host_that_reported_before_joining_keeps_its_row_and_joins() -> None:
    FleetHost.objects.create(name="gpu-2", credential_made_at=timezone.now(),
                             **unjoined_credential())
    before = FleetHost.objects.get(name="gpu-2")
    done = joined("gpu-2")
    host = FleetHost.objects.get(name="gpu-2")
    assert host.pk == before.pk and host.is_joined and host.joined_at >= before.joined_at
    assert selectors.host_for_credential(credential=done.credential) == host


def test_a_joined_hosts_heartbeat_writes_its_report_columns() -> None:
    joined("gpu-2", gpus=None, gpu_count=2, secret_names=["B", "A"])
    host = FleetHost.objects.get(name="gpu-2")
    assert host.agent_id == "agent@gpu-2" and host.secret_names == ["A", "B"]
    assert host.gpu_telemetry == {"available": False, "reason": "a GPU count, no NVML",
                                  "gpus": [{"index": 0}, {"index": 1}]}
    services.host_heartbeat(host=host, facts=services.host_facts_from(
        {"agent_version": "0.9.1", "gpus": TELEMETRY["gpus"], "secret_names": []}))
    host.refresh_from_db()
    assert host.gpu_telemetry["available"] is True and host.secret_names == []
    assert [g["index"] for g in host.gpu_telemetry["gpus"]] == [0, 1]


def test_with_no_reports_registered_a_silence_read_fails_loudly(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from web.deployments.services import hostreports
    from web.deployments.silence import agents_last_seen

    host_reported(name="gpu-host", agent_id="agent@gpu-host")
    assert set(agents_last_seen()) == {"agent@gpu-host"}
    monkeypatch.setattr(hostreports, "_registered", None)  # a process where web.fleet never started
    with pytest.raises(hostreports.ReportsNotRegistered, match="FleetConfig.ready"):
        agents_last_seen()


def test_a_row_made_before_its_first_report_is_no_agent_heard() -> None:
    from web.deployments.silence import agents_last_seen

    joined("gpu-2")
    FleetHost.objects.create(name="quiet", credential_made_at=timezone.now(),
                             agent_id="agent@quiet", **unjoined_credential())
    assert set(agents_last_seen()) == {"agent@gpu-2"}
    assert [h.name for h in selectors.hosts_list()] == ["gpu-2"]


place_own_rows = importlib.import_module(
    "web.fleet.migrations.0006_own_host_placements").place_own_rows


def test_the_migration_places_the_own_hosts_rows_that_have_not_ended() -> None:
    from django.apps import apps

    from web.deployments.models import Deployment

    older = queued(name="older", gpus=[0])  # made before placements: no host recorded
    own = queued(name="own", gpus=[1])
    ended = queued(name="ended", gpus=[2])
    elsewhere = queued(name="elsewhere", gpus=[3])
    Placement.objects.all().delete()
    FleetHost.objects.all().delete()  # an install whose own agent never reported
    Deployment.objects.filter(pk=older.pk).update(host="", placement_reason="")
    Deployment.objects.filter(pk=ended.pk).update(status="stopped")
    Deployment.objects.filter(pk=elsewhere.pk).update(host="renamed-box")
    place_own_rows(apps, None)
    placed = dict(Placement.objects.values_list("deployment_id", "host__name"))
    assert placed == {older.pk: "gpu-host", own.pk: "gpu-host"}
    host = FleetHost.objects.get()
    assert host.name == "gpu-host" and not host.is_joined
    assert Placement.objects.get(deployment=own).reason == own.placement_reason
    place_own_rows(apps, None)  # run again (a re-applied migration): nothing doubled
    assert Placement.objects.count() == 2
