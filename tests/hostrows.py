"""A host's agent report written as the panel's own agent writes it, for tests that need
a host with given facts without running an agent."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from web.fleet.models import FleetHost, unjoined_credential


def host_reported(*, name: str, **report: Any) -> FleetHost:
    """The host's row with `report`'s columns (agent_id, heartbeat_at, docker,
    gpu_telemetry, secret_names, foreign_containers; agent@<name> and now unless given): a
    joined host's row keeps its credential, a new one gets one nothing opens."""
    fields = {"agent_id": f"agent@{name}", "heartbeat_at": timezone.now(), **report}
    row, _ = FleetHost.objects.update_or_create(
        name=name, defaults=fields,
        create_defaults={**fields, "credential_made_at": timezone.now(),
                         **unjoined_credential()})
    return row
