"""Each host's agent report as this app reads it: a hook the app that owns it registers.

The reports (name, agent_id, heartbeat_at, docker, gpu_telemetry, secret_names,
foreign_containers) are a host's concern and live in web/fleet (FleetHost, every host's
row, the panel's own included); this app imports none of web's other apps, so the silence
of a deployment's agent, the simulator's images, pre-flight's host facts and the Hosts page
read the model registered here, which web/fleet's FleetConfig.ready registers when Django
starts. With nothing registered a read raises ReportsNotRegistered: no page says an agent
reports, or is silent, from no reports at all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.db import models


class HostReport(Protocol):
    """One host's report as this app reads it."""

    name: str
    agent_id: str
    heartbeat_at: datetime | None
    docker: Any
    gpu_telemetry: Any
    secret_names: Any
    foreign_containers: Any


class ReportsNotRegistered(RuntimeError):
    """No app registered the hosts' reports (web.fleet is missing from INSTALLED_APPS, or
    Django was not set up)."""


_registered: type[models.Model] | None = None


def register(model: type[models.Model]) -> None:
    """Make `model` (with HostReport's fields) the hosts' reports (the last one wins)."""
    global _registered
    _registered = model


def host_reports() -> models.QuerySet[Any]:
    """Every host's report row, with a heartbeat (a row made before its first report has
    none)."""
    if _registered is None:
        raise ReportsNotRegistered(
            "no host reports are registered: web.fleet registers them when Django starts "
            "(FleetConfig.ready); add it to INSTALLED_APPS, or call django.setup() first")
    return _registered._default_manager.filter(heartbeat_at__isnull=False)
