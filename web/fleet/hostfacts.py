"""The facts pre-flight checks a spec against, of the host placement chose.

A joined host is read from its own row, the one its heartbeat writes; the panel's own host
(APPLIANCE_HOST_NAME) from its agent's rows: the fresh FleetHost rows of no joined host
(its agent reports under its agent id, which a host install may not set to the host's
name). So a spec placed on gpu-2 is checked against gpu-2's GPUs, Docker and secret store,
never against another host's.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from web.deployments.services.hosts import HOST_FRESH_S, PreflightHost, preflight_host

from .models import FleetHost


def host_facts(*, name: str) -> PreflightHost:
    """The named host's facts as its fresh reports give them (the panel's own host: with
    this panel's settings where none says)."""
    fresh = timezone.now() - timedelta(seconds=HOST_FRESH_S)
    rows = FleetHost.objects.filter(heartbeat_at__gte=fresh).order_by("-heartbeat_at", "name")
    joined = list(FleetHost.objects.joined().values_list("name", flat=True))
    if name != str(settings.HOST_NAME) or name in joined:
        return preflight_host(name=name, reports=list(rows.filter(name=name)), own=False)
    return preflight_host(name=name, reports=list(rows.exclude(name__in=joined)), own=True)
