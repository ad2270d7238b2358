"""Reads for the fleet: the host a credential names, each host's state, the join tokens."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from hmac import compare_digest
from typing import Any

from django.conf import settings
from django.utils import timezone

from web.deployments.models import GpuLease, Host

from .models import FleetHost, JoinToken, Placement
from .services import CREDENTIAL_PREFIX, secret_digest

MAX_CREDENTIAL = 128


def host_lost_after_s() -> int:
    """A host whose last heartbeat is older than this is `lost` (the agents' silence
    threshold, APPLIANCE_AGENT_SILENT_S, where the panel has it; 30 s otherwise)."""
    return int(getattr(settings, "AGENT_SILENT_S", 30))


def host_for_credential(*, credential: str) -> FleetHost | None:
    """The joined host whose credential this is; None for anything else (a removed host's,
    a rotated one, a join token, a user's API token)."""
    if not (credential.startswith(CREDENTIAL_PREFIX) and len(credential) <= MAX_CREDENTIAL):
        return None
    digest = secret_digest(credential)
    host = FleetHost.objects.filter(credential_digest=digest).first()
    if host is None or not compare_digest(host.credential_digest, digest):
        return None
    return host


def host_state(*, host: FleetHost, now: datetime) -> str:
    """lost (no heartbeat within host_lost_after_s), else draining or ready."""
    fresh = timedelta(seconds=host_lost_after_s())
    if host.heartbeat_at is None or now - host.heartbeat_at > fresh:
        return "lost"
    return "draining" if host.draining else "ready"


@dataclass(frozen=True)
class HostRow:
    """One host as the fleet page and the API show it."""

    name: str
    joined: bool  # False: the panel's own host (its agent writes the database directly)
    state: str
    draining: bool
    agent_version: str
    gpus: list[dict[str, Any]]
    gpu_source: str
    docker: dict[str, Any]
    heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    joined_at: datetime | None
    credential_prefix: str
    credential_last_used_at: datetime | None
    deployments: list[int]  # placed here, or holding GPUs here
    held_gpus: list[int]  # GPU indexes a deployment leases here

    @property
    def free_gpus(self) -> int:
        return len({g.get("index") for g in self.gpus} - set(self.held_gpus))


def host_rows(*, now: datetime | None = None) -> list[HostRow]:
    """Every host: the joined ones and the panel's own (its agent's report), by name."""
    now = now or timezone.now()
    engines: dict[str, set[int]] = {}
    held: dict[str, list[int]] = {}
    for name, pk in Placement.objects.values_list("host__name", "deployment_id"):
        engines.setdefault(name, set()).add(pk)
    for name, gpu, pk in GpuLease.objects.values_list("host", "gpu_index", "deployment_id"):
        engines.setdefault(name, set()).add(pk)
        held.setdefault(name, []).append(gpu)
    joined = {h.name: h for h in FleetHost.objects.all()}
    rows = [_joined_row(h, now) for h in joined.values()]
    rows += [_local_row(r, now) for r in Host.objects.exclude(name__in=list(joined))]
    return sorted((dataclasses.replace(r, deployments=sorted(engines.get(r.name, ())),
                                       held_gpus=sorted(held.get(r.name, [])))
                   for r in rows), key=lambda r: r.name)


def _age(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (now - at).total_seconds())


def _joined_row(h: FleetHost, now: datetime) -> HostRow:
    return HostRow(
        name=h.name, joined=True, state=host_state(host=h, now=now), draining=h.draining,
        agent_version=h.agent_version, gpus=list(h.gpus or []), gpu_source=h.gpu_source,
        docker=dict(h.docker or {}), heartbeat_at=h.heartbeat_at,
        heartbeat_age_s=_age(h.heartbeat_at, now), joined_at=h.joined_at,
        credential_prefix=h.credential_prefix, credential_last_used_at=h.credential_last_used_at,
        deployments=[], held_gpus=[])


def _local_row(r: Host, now: datetime) -> HostRow:
    telemetry = r.gpu_telemetry or {}
    fresh = now - r.heartbeat_at <= timedelta(seconds=host_lost_after_s())
    return HostRow(
        name=r.name, joined=False, state="ready" if fresh else "lost", draining=False,
        agent_version="", gpus=list(telemetry.get("gpus") or []),
        gpu_source="nvml" if telemetry.get("available") else "",
        docker=dict(r.docker or {}), heartbeat_at=r.heartbeat_at,
        heartbeat_age_s=_age(r.heartbeat_at, now), joined_at=None, credential_prefix="",
        credential_last_used_at=None, deployments=[], held_gpus=[])


def jointoken_list() -> list[JoinToken]:
    return list(JoinToken.objects.select_related("created_by"))


def jointoken_state(*, token: JoinToken, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    return "expired" if token.expires_at <= now else "usable"


def host_deployment_ids(*, host: FleetHost) -> list[int]:
    """The deployments placed on the host: all it may write events for."""
    return sorted(Placement.objects.filter(host=host).values_list("deployment_id", flat=True))
