"""The GPU leases as this app reaches them: a hook the app that owns them registers.

GPU leases are a host's concern and live in web/fleet (web/fleet/leases.py); this app
imports none of web's other apps, so its writers that take or give back GPUs (a restart, the
roller's step, the terminal transitions in lifecycle.py) call the leases registered here,
which web/fleet's FleetConfig.ready registers when Django starts. Each call runs in the
caller's transaction: a lease taken with a status move, or given back with the move into a
terminal status, commits or rolls back with it.

With nothing registered a call raises LeasesNotRegistered: a status move never goes
through without its lease being taken or given back.
"""

from __future__ import annotations

from typing import Protocol

from ..models import Deployment


class GpuLeases(Protocol):
    """What the owner of the leases gives this app (web/fleet/leases.py, a module)."""

    def gpu_leases_acquire(self, *, deployment: Deployment) -> None:
        """Lease each of the deployment's GPUs on its host, all or none; a refusal raises
        DeploymentInputError on the `gpus` field."""

    def gpu_leases_release(self, *, deployment_id: int) -> int:
        """Give back every GPU the deployment holds; the number released."""


class LeasesNotRegistered(RuntimeError):
    """No app registered the GPU leases (web.fleet is missing from INSTALLED_APPS, or
    Django was not set up)."""


_registered: GpuLeases | None = None


def register(leases: GpuLeases) -> None:
    """Make `leases` the GPU leases of every call below (the last registration wins)."""
    global _registered
    _registered = leases


def registered() -> GpuLeases:
    if _registered is None:
        raise LeasesNotRegistered(
            "no GPU leases are registered: web.fleet registers them when Django starts "
            "(FleetConfig.ready); add it to INSTALLED_APPS, or call django.setup() first")
    return _registered


def acquire(*, deployment: Deployment) -> None:
    """Lease the deployment's GPUs, in the caller's transaction."""
    registered().gpu_leases_acquire(deployment=deployment)


def release(*, deployment_id: int) -> int:
    """Give back the deployment's GPUs, in the caller's transaction; the number released."""
    return registered().gpu_leases_release(deployment_id=deployment_id)
