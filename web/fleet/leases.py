"""GPU leases: a deployment holds its GPUs from creation until it ends.

A lease is a GpuLease row per host and GPU, unique while held; the database settles a
race between two requests (both INSERT, one wins), never a check before the insert.
Acquire inside the transaction that creates (or restarts) the deployment; the terminal
transitions (stopped, failed) release in the transaction that moves the status, so a held
row always has a live holder.

web/deployments (its restarts, the roller's steps, the terminal transitions) reaches this
module only through the hook it offers, web/deployments/services/gpus.py, which this
app's FleetConfig.ready registers this module in; everything above both imports it here.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError, transaction

from web.deployments.models import Deployment
from web.deployments.services.errors import DeploymentInputError

from .models import GpuLease


def lease_host(*, deployment: Deployment) -> str:
    """The host a deployment row's GPUs are leased on: its placement's (web/fleet/
    placement.py), or the panel's own host (APPLIANCE_HOST_NAME) for a row from before."""
    return deployment.host or str(settings.HOST_NAME)


def gpu_leases_acquire(*, deployment: Deployment) -> None:
    """Lease each of the deployment's GPUs on its host, all or none.

    Raises DeploymentInputError on the `gpus` field naming each GPU another deployment
    holds, and that deployment; the caller's transaction then rolls back what it wrote.
    A GPU this deployment holds already (a retried restart) is kept.
    """
    host = lease_host(deployment=deployment)
    wanted = [g for g in deployment.gpus if isinstance(g, int)]
    GpuLease.objects.filter(deployment=deployment).exclude(gpu_index__in=wanted).delete()
    for _attempt in range(3):
        held = set(GpuLease.objects.filter(deployment=deployment)
                   .values_list("gpu_index", flat=True))
        try:
            # A savepoint: the failed INSERT leaves the caller's transaction usable.
            with transaction.atomic():
                GpuLease.objects.bulk_create([
                    GpuLease(host=host, gpu_index=g, deployment=deployment)
                    for g in wanted if g not in held])
            return
        except IntegrityError:
            _refuse(deployment=deployment, host=host, gpus=wanted)
            # No holder left to name: it ended between the INSERT and the read; try again.
    raise DeploymentBusyError("the GPUs' leases kept changing; try again")


class DeploymentBusyError(RuntimeError):
    """Leases changed under three attempts in a row (many deployments ending at once)."""


def _refuse(*, deployment: Deployment, host: str, gpus: Iterable[int]) -> None:
    holders = (GpuLease.objects.filter(host=host, gpu_index__in=list(gpus))
               .exclude(deployment=deployment).select_related("deployment"))
    messages = [gpu_lease_conflict_text(lease=lease) for lease in holders]
    if messages:
        raise DeploymentInputError(errors={"gpus": messages})


def gpu_lease_conflict_text(*, lease: GpuLease) -> str:
    holder = lease.deployment  # the row that holds it, and whose replica it is
    of = (f"replica {holder.replica_index} of #{holder.replica_of_id}, "
          if holder.replica_of_id else "")
    return (f"GPU {lease.gpu_index} on host {lease.host} is held by deployment "
            f"#{holder.pk} '{holder.name}' ({of}{holder.status}); stop it or choose other GPUs.")


def gpu_leases_release(*, deployment_id: int) -> int:
    """Give back every GPU the deployment holds; the number released."""
    deleted, _ = GpuLease.objects.filter(deployment_id=deployment_id).delete()
    return deleted
