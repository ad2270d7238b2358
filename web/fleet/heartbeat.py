"""A joined host's state, read from its heartbeat: what placement and the fleet's pages
both judge a host by."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from .models import FleetHost


def host_lost_after_s() -> int:
    """A host whose last heartbeat is older than this is `lost` (the agents' silence
    threshold, APPLIANCE_AGENT_SILENT_S, where the panel has it; 30 s otherwise)."""
    return int(getattr(settings, "AGENT_SILENT_S", 30))


def host_state(*, host: FleetHost, now: datetime) -> str:
    """lost (no heartbeat within host_lost_after_s), else draining or ready."""
    fresh = timedelta(seconds=host_lost_after_s())
    if host.heartbeat_at is None or now - host.heartbeat_at > fresh:
        return "lost"
    return "draining" if host.draining else "ready"
