"""GET /api/hosts/: each GPU host's agent, whether it is silent, and the deployments it
watches with the status the pages show (`unknown` while the agent is silent)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import permissions
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from web.deployments.models import Deployment
from web.deployments.permissions import can_view
from web.deployments.silence import UNKNOWN, WATCHED_STATUSES, host_silence
from web.fleet.models import FleetHost


def _host(host: FleetHost, watched: list[Deployment]) -> dict[str, Any]:
    silence = host_silence(host=host)
    return {
        "name": host.name, "agent_id": host.agent_id,
        "heartbeat_at": host.heartbeat_at.isoformat() if host.heartbeat_at else None,
        "agent": silence.to_dict() if silence else {"agent_id": host.agent_id, "silent": False},
        "deployments": [{"id": d.pk, "name": d.name, "status": d.status,
                         "shown_status": UNKNOWN if silence else d.status}
                        for d in watched if d.agent_id == host.agent_id],
        "foreign_containers": host.foreign_containers,
        "engine_network_open": (host.docker or {}).get("engine_network_open", ""),
    }


class CanView(permissions.BasePermission):
    message = "You need the viewer role (or operator) to see hosts."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_view(request.user)


@extend_schema(request=None, responses={200: dict})
@api_view(["GET"])
@permission_classes([permissions.IsAuthenticated, CanView])
def host_list(request: Request) -> Response:
    """The hosts whose agents reported, newest report first."""
    watched = list(Deployment.objects.filter(status__in=WATCHED_STATUSES)
                   .only("name", "status", "agent_id"))
    return Response({"hosts": [_host(h, watched)
                               for h in FleetHost.objects.filter(heartbeat_at__isnull=False)
                               .order_by("-heartbeat_at")]})
