"""Reads: lists, one deployment, its events, its summary."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from .models import Deployment, Event, Host


def deployment_list(*, status: str | None = None) -> QuerySet[Deployment]:
    deployments = Deployment.objects.all()
    if status:
        deployments = deployments.filter(status=status)
    return deployments


def deployment_get(*, deployment_id: int) -> Deployment:
    return Deployment.objects.get(pk=deployment_id)


def events_after(*, deployment_id: int, after_seq: int = 0, limit: int = 500) -> list[Event]:
    return list(
        Event.objects.filter(deployment_id=deployment_id, seq__gt=after_seq).order_by("seq")[:limit]
    )


def deployment_summary(*, deployment: Deployment) -> dict[str, Any]:
    return {
        "id": deployment.pk,
        "name": deployment.name,
        "status": deployment.status,
        "phase": deployment.phase,
        "progress": deployment.progress,
        "decode_stats": deployment.decode_stats or None,
        "diagnosis": deployment.diagnosis,
        "engine_url": deployment.engine_url,
        "last_seq": deployment.last_seq,
        "is_terminal": deployment.is_terminal,
    }


def hosts_list() -> list[Host]:
    """The GPU hosts whose engine agents reported, newest report first."""
    return list(Host.objects.order_by("-heartbeat_at"))
