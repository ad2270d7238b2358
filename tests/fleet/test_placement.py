"""Placement: where each replica row of a deployment runs (a named host, or the panel's
choice among the hosts that take new engines), why, and what a refusal names."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.hostrows import host_reported
from tests.rows import queued
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.fleet import services as fleet
from web.fleet.models import FleetHost, GpuLease, Placement
from web.fleet.selectors import host_placements, joined_host_of

from .hosts import joined

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db


def _lost(name: str) -> None:
    FleetHost.objects.filter(name=name).update(
        heartbeat_at=timezone.now() - timedelta(minutes=5))


def _fleet() -> None:
    """gpu-2 ready (8 H200), gpu-3 lost, gpu-4 draining; the panel's own host gpu-host."""
    joined("gpu-2")
    joined("gpu-3")
    _lost("gpu-3")
    joined("gpu-4")
    fleet.host_set_draining(name="gpu-4", draining=True)


def _rows(first: Deployment) -> list[Deployment]:
    return [first, *Deployment.objects.filter(replica_of=first).order_by("replica_index")]


def _refused(**changes: object) -> dict[str, list[str]]:
    with pytest.raises(services.DeploymentInputError) as caught:
        queued(**changes)
    return caught.value.errors


def test_a_spec_without_host_on_the_one_host_product_runs_on_the_panels_host() -> None:
    made = queued(gpus=[0, 1])
    assert (made.host, made.gpus, made.replica_index, made.replica_of_id) == (
        "gpu-host", [0, 1], 0, None)
    assert made.placement_reason == "gpu-host: 8 free GPUs, this panel's host"
    assert set(GpuLease.objects.values_list("host", "gpu_index")) == {("gpu-host", 0),
                                                                      ("gpu-host", 1)}
    # Placed on the panel's host like any host, on a row that opens no host API write
    # (its agent writes the database itself), made here since that agent never reported.
    placement = Placement.objects.get()
    assert (placement.deployment_id, placement.host.name, placement.replica) == (made.pk,
                                                                                 "gpu-host", 0)
    assert not placement.host.is_joined and placement.reason == made.placement_reason
    assert joined_host_of(deployment_id=made.pk) == "", "its image is built by the panel"


@pytest.mark.parametrize("name", ["h" * 64, "GPU-Host", "gpu host", "-gpu", ""])
def test_an_own_host_name_no_host_row_can_carry_stops_the_panel_at_its_start(name: str) -> None:
    # Its agent could join under no such name, so a row placed there would run nowhere.
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "web.settings",
           "APPLIANCE_HOST_NAME": name}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "APPLIANCE_HOST_NAME=" in done.stderr
    assert "1 to 63 lowercase letters, digits and hyphens" in done.stderr


def test_the_own_host_joined_and_drained_takes_no_new_row_and_says_so() -> None:
    queued(name="first", gpus=[0])  # its row made, placed on it
    joined("gpu-host")  # its agent joined with the own host's token
    host_reported(name="gpu-host")
    fleet.host_set_draining(name="gpu-host", draining=True)
    refused = _refused(gpus=[1])
    assert "gpu-host is draining" in refused["gpus"][0], refused


def test_a_named_host_takes_the_row_its_leases_and_its_write_scope() -> None:
    _fleet()
    made = queued(host="gpu-2", gpus=[3])
    assert (made.host, made.gpus) == ("gpu-2", [3])
    assert made.placement_reason == "gpu-2: 8 free H200 GPUs, named by the spec's host"
    assert list(GpuLease.objects.values_list("host", "gpu_index")) == [("gpu-2", 3)]
    placement = Placement.objects.get()
    assert (placement.deployment_id, placement.host.name, placement.replica) == (made.pk,
                                                                                 "gpu-2", 0)
    assert placement.reason == made.placement_reason


@pytest.mark.parametrize(("host", "said"), [
    ("gpu-9", "No host 'gpu-9' in the fleet; the hosts are gpu-2, gpu-3, gpu-4, gpu-host "
              "(this panel)."),
    ("gpu-3", "Host gpu-3 is lost: its heartbeat stopped."),
    ("gpu-4", "Host gpu-4 is draining: no new engine goes there."),
])
def test_it_refuses_a_named_host_that_is_unknown_lost_or_draining_storing_nothing(
        host: str, said: str) -> None:
    _fleet()
    errors = _refused(host=host, replicas=2)
    assert list(errors) == ["host"] and errors["host"][0].startswith(said)
    assert "leave host out to let the panel place it" in errors["host"][0]
    assert not Deployment.objects.exists() and not GpuLease.objects.exists()


def test_a_named_host_lacking_the_gpus_is_refused_by_its_lease_naming_the_holder() -> None:
    joined("gpu-2")
    holder = queued(host="gpu-2", gpus=[0])
    errors = _refused(name="second", host="gpu-2", gpus=[0])
    assert errors == {"gpus": [f"GPU 0 on host gpu-2 is held by deployment #{holder.pk} "
                               "'kimi-ddtree' (queued); stop it or choose other GPUs."]}


def test_replicas_spread_over_the_ready_hosts_then_other_gpus_skipping_lost_and_draining(
        ) -> None:
    _fleet()
    first = queued(gpus=[0], replicas=3)
    rows = _rows(first)
    assert [(r.replica_index, r.host, r.gpus) for r in rows] == [
        (0, "gpu-host", [0]), (1, "gpu-2", [0]), (2, "gpu-host", [1])]
    assert {r.replica_of_id for r in rows[1:]} == {first.pk}
    assert rows[1].placement_reason == ("gpu-2: 8 free H200 GPUs, no replica of this "
                                        "deployment there yet; gpu-3 lost; gpu-4 draining")
    assert rows[2].placement_reason.startswith("gpu-host: 7 free GPUs, this panel's host")
    assert sorted(GpuLease.objects.values_list("host", "gpu_index", "deployment_id")) == [
        ("gpu-2", 0, rows[1].pk), ("gpu-host", 0, first.pk), ("gpu-host", 1, rows[2].pk)]
    # Each row is a Placement on its host; only the joined host's opens a write (gpu-2's).
    assert sorted(Placement.objects.values_list("deployment_id", "replica", "host__name")) == [
        (first.pk, 0, "gpu-host"), (rows[1].pk, 1, "gpu-2"), (rows[2].pk, 2, "gpu-host")]
    assert list(Placement.objects.filter(host__in=FleetHost.objects.joined()).values_list(
        "deployment_id", flat=True)) == [rows[1].pk]
    # Each row is its own engine, queued for its own deploy task.
    assert all(r.status == "queued" and r.name == "kimi-ddtree" for r in rows)


def test_the_panel_places_on_the_joined_host_with_the_fewest_engines(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 1
    joined("gpu-2")
    joined("gpu-3")
    queued(host="gpu-2", gpus=[3])  # gpu-2 runs one engine now
    made = queued(name="second", gpus=[0])  # the panel's host has GPU 0 free: it comes first
    third = queued(name="third", gpus=[0])
    assert (made.host, third.host) == ("gpu-host", "gpu-3")
    assert third.placement_reason == ("gpu-3: 8 free H200 GPUs, fewest engines; gpu-host "
                                      "lacks the GPUs")


def test_a_refusal_names_what_each_host_lacks_and_stores_nothing(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    joined("gpu-2", gpus=None, gpu_count=2)
    joined("gpu-3")
    _lost("gpu-3")
    holder = queued(name="kimi-a", host="gpu-2", gpus=[1])
    errors = _refused(gpus=[0, 1], replicas=2)
    assert errors == {"replicas": [
        "Replica 1 needs 2 free GPUs on one host: gpu-2 has 1 free "
        f"(GPU 1 held by kimi-a #{holder.pk}), gpu-3 is lost, gpu-host has 0 free "
        "(GPU 0 taken by replica 0; GPU 1 taken by replica 0). Fix: ask for fewer replicas, "
        "stop a deployment that holds GPUs, or join another host."]}
    assert list(Deployment.objects.values_list("pk", flat=True)) == [holder.pk]
    assert list(GpuLease.objects.values_list("deployment_id", flat=True)) == [holder.pk]


def test_replica_zero_whose_gpus_no_host_has_free_is_refused_per_host(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    joined("gpu-2", gpus=None, gpu_count=1)
    holder = queued(name="kimi-a", gpus=[1])
    errors = _refused(gpus=[0, 1])
    assert errors["gpus"] == [
        f"Replica 0 needs GPUs 0, 1 free on one host: gpu-2 has 1 free (no GPU 1), "
        f"gpu-host has 1 free (GPU 1 held by kimi-a #{holder.pk}). Fix: stop a deployment "
        "that holds them, choose other GPUs, or join a host with them."]
    assert Deployment.objects.count() == 1


def test_a_silent_panel_host_still_takes_a_spec_when_no_ready_host_can(settings) -> None:  # type: ignore[no-untyped-def]
    host_reported(name="gpu-host", agent_id="agent@gpu-host",
                  heartbeat_at=timezone.now() - timedelta(minutes=10))
    made = queued(gpus=[0])
    assert made.host == "gpu-host" and "its agent silent" in made.placement_reason
    joined("gpu-2")
    second = queued(name="second", gpus=[0])
    assert second.host == "gpu-2"  # a ready host before a silent one


def test_the_own_hosts_agent_is_given_only_the_rows_placed_on_its_own_host() -> None:
    gpu_2 = joined("gpu-2").host
    first = queued(gpus=[0], replicas=2)
    replica = Deployment.objects.get(replica_of=first)
    assert (first.host, replica.host) == ("gpu-host", "gpu-2")  # spread
    for pk in (first.pk, replica.pk):
        services.deployment_mark_starting(deployment_id=pk, image="img", start_token=f"t{pk}")
    own = FleetHost.objects.get(name="gpu-host")
    assert [row["id"] for row in host_placements(host=own)] == [first.pk]
    assert [row["id"] for row in host_placements(host=gpu_2)] == [replica.pk]
    # gpu-2's agent's from its start (a silent gpu-2 makes it `unknown`), never the panel's.
    assert Deployment.objects.get(pk=replica.pk).agent_id == "agent@gpu-2"


def test_gpu_ids_only_a_joined_host_has_are_placed_there(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 1  # the panel's own host: GPU 0 only
    joined("gpu-2", gpus=None, gpu_count=4)
    made = queued(gpus=[2, 3], engine__tp_size=2)
    assert (made.host, made.gpus) == ("gpu-2", [2, 3])
    assert made.placement_reason == "gpu-2: 4 free GPUs; gpu-host lacks the GPUs"
    # No host has GPU 4: placement refuses first, naming what each host lacks.
    errors = _refused(name="second", gpus=[4])
    assert errors["gpus"] == [
        "Replica 0 needs GPU 4 free on one host: gpu-2 has 2 free (no GPU 4), gpu-host has 1 "
        "free (no GPU 4). Fix: stop a deployment that holds them, choose other GPUs, or join "
        "a host with them."]
    # Named, gpu-2 is the one host to take it: pre-flight checks it against gpu-2's count.
    errors = _refused(name="second", gpus=[4], host="gpu-2")
    assert "GPU ids [4] are not on this host: it has 4 GPUs (ids 0 to 3, per the " \
        "count gpu-2 states)" in errors["gpus"][0]


def test_a_gpu_held_by_a_replica_row_names_that_row_and_its_deployment(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    joined("gpu-2", gpus=None, gpu_count=1)
    first = queued(name="ddt", gpus=[0], replicas=3)
    rows = _rows(first)
    assert [(r.host, r.gpus) for r in rows] == [
        ("gpu-host", [0]), ("gpu-2", [0]), ("gpu-host", [1])]
    errors = _refused(name="other", gpus=[1])
    assert errors["gpus"] == [
        f"Replica 0 needs GPU 1 free on one host: gpu-2 has 0 free (no GPU 1), gpu-host has 0 "
        f"free (GPU 1 held by ddt #{rows[2].pk} (replica 2 of #{first.pk})). Fix: stop a "
        "deployment that holds them, choose other GPUs, or join a host with them."]
    # Only one host to take it: the lease's refusal names the row that holds the GPU too.
    errors = _refused(name="other", gpus=[1], host="gpu-host")
    assert errors["gpus"] == [
        f"GPU 1 on host gpu-host is held by deployment #{rows[2].pk} 'ddt' (replica 2 of "
        f"#{first.pk}, queued); stop it or choose other GPUs."]


def test_a_reason_says_a_host_has_fewer_replicas_rather_than_none_when_it_has_one(
        settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 0
    joined("gpu-2")
    joined("gpu-3")
    first = queued(gpus=[0], replicas=3)  # gpu-2, gpu-3, then the host with fewer
    fourth = deploying.deployment_scale(deployment_id=first.pk, replicas=4)
    rows = _rows(fourth)
    hosts = [r.host for r in rows]
    assert sorted(hosts) == ["gpu-2", "gpu-2", "gpu-3", "gpu-3"]
    assert rows[1].placement_reason.startswith(f"{rows[1].host}: 8 free H200 GPUs, no replica "
                                               "of this deployment there yet")
    # The 4th goes to the host with one replica while the other has two: not "none there".
    assert rows[3].placement_reason.startswith(
        f"{rows[3].host}: 7 free H200 GPUs, fewest replicas of this deployment there (1)"), \
        rows[3].placement_reason
