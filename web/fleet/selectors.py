"""Reads for the fleet: the host a credential names, each host's state, the GPU board (each
host's GPUs and who leases each), the join tokens."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from hmac import compare_digest
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from appliance.engine.errors import SpecError
from appliance.engine.recipes import RecipeError
from appliance.images.lock import lock_digest
from appliance.images.plan import BuildError, recipe_lock_path
from appliance.lifecycle import AGENT_OWNED
from web.deployments.models import Deployment
from web.deployments.services.deployments import recipe_load
from web.deployments.silence import host_silence
from web.deployments.simulator import simulated_build, simulator_images
from web.store.loadtime import deployment_models_refused

from .heartbeat import host_lost_after_s, host_state
from .models import FleetHost, GpuLease, JoinToken, Placement
from .services import CREDENTIAL_PREFIX, secret_digest

MAX_CREDENTIAL = 128


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


# What a host's write to one deployment reads of its host: who it is, when its credential
# was last stamped and which agent process holds it (the rest of the row stays unread).
_WRITER_FIELDS = ("id", "name", "credential_digest", "credential_last_used_at",
                  "agent_session", "agent_lease_until")
_BIGINT_MAX = 2**63 - 1


@cache
def _writer_sql() -> str:
    quote = connection.ops.quote_name
    column = {f.name: quote(str(f.column)) for f in FleetHost._meta.concrete_fields}
    return (f"SELECT {', '.join(f'h.{column[name]}' for name in _WRITER_FIELDS)}, "
            f"EXISTS (SELECT 1 FROM {quote(Placement._meta.db_table)} p WHERE "
            f"p.{quote(Placement.host.field.column)} = h.{column['id']} AND "
            f"p.{quote(Placement.deployment.field.column)} = %s) "
            f"FROM {quote(FleetHost._meta.db_table)} h WHERE h.{column['credential_digest']} = %s")


def host_placed_for_credential(*, credential: str,
                               deployment_id: int) -> tuple[FleetHost, bool] | None:
    """host_for_credential, and whether the deployment is placed on that host, in one
    statement (a busy host's ingest runs it for every batch): None as host_for_credential
    is. The host is read with the fields a write checks only (_WRITER_FIELDS; any other is
    loaded when first touched)."""
    if not (credential.startswith(CREDENTIAL_PREFIX) and len(credential) <= MAX_CREDENTIAL):
        return None
    digest = secret_digest(credential)
    with connection.cursor() as cursor:
        cursor.execute(_writer_sql(), [min(deployment_id, _BIGINT_MAX), digest])
        row = cursor.fetchone()
    if row is None or not compare_digest(row[2], digest):
        return None
    return FleetHost.from_db(connection.alias, list(_WRITER_FIELDS), row[:-1]), bool(row[-1])


@dataclass(frozen=True)
class HostRow:
    """One host as the fleet page and the API show it."""

    name: str
    joined: bool  # False: the panel's own host before its agent has joined
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
    joined = {h.name: h for h in FleetHost.objects.joined()}
    rows = [_joined_row(h, now) for h in joined.values()]
    rows += [_local_row(r, now) for r in FleetHost.objects.unjoined().exclude(
        name__in=list(joined)).filter(heartbeat_at__isnull=False)]
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


def _local_row(r: FleetHost, now: datetime) -> HostRow:
    telemetry = r.gpu_telemetry or {}
    fresh = r.heartbeat_at is not None and (
        now - r.heartbeat_at <= timedelta(seconds=host_lost_after_s()))
    return HostRow(
        name=r.name, joined=False, state="ready" if fresh else "lost", draining=False,
        agent_version="", gpus=list(telemetry.get("gpus") or []),
        gpu_source="nvml" if telemetry.get("available") else "",
        docker=dict(r.docker or {}), heartbeat_at=r.heartbeat_at,
        heartbeat_age_s=_age(r.heartbeat_at, now), joined_at=None, credential_prefix="",
        credential_last_used_at=None, deployments=[], held_gpus=[])


def hosts_list() -> list[FleetHost]:
    """The GPU hosts whose agents reported, newest report first, each with its agent's
    silence (`silence`, None while it reports)."""
    return [host_with_silence(host) for host in
            FleetHost.objects.filter(heartbeat_at__isnull=False).order_by("-heartbeat_at")]


def host_with_silence(host: FleetHost) -> FleetHost:
    host.silence = host_silence(host=host)  # type: ignore[attr-defined]  # for the pages
    return host


# ------------------------------------------------------------------ the GPU board


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of a host as the Hosts page shows it: what NVML says and who holds it."""

    index: int
    name: str
    telemetry: dict[str, Any]
    holder: Deployment | None


@dataclass(frozen=True)
class HostGpus:
    name: str
    host: FleetHost | None  # the agent's report; None before an agent reported
    source: str  # where the GPU count comes from
    gpus: list[GpuSlot]
    # Leases on GPU ids the host does not report (a spec from before the count was known).
    beyond: list[GpuSlot]


def hosts_gpu_board(*, lease_host: str, configured_count: int) -> list[HostGpus]:
    """Each GPU host's GPUs with the deployment that leases each (one query per table)."""
    leases: dict[tuple[str, int], Deployment] = {
        (lease.host, lease.gpu_index): lease.deployment
        for lease in GpuLease.objects.select_related("deployment")}
    hosts = {h.name: host_with_silence(h)
             for h in FleetHost.objects.filter(heartbeat_at__isnull=False).order_by("name")}
    names = sorted({lease_host, *hosts, *(host for host, _ in leases)})
    return [_host_gpus(name, hosts.get(name), leases, lease_host, configured_count)
            for name in names]


def _host_gpus(name: str, host: FleetHost | None, leases: dict[tuple[str, int], Deployment],
               lease_host: str, configured_count: int) -> HostGpus:
    telemetry = (host.gpu_telemetry or {}) if host else {}
    reported = {int(g["index"]): g for g in telemetry.get("gpus") or []
                if isinstance(g, dict) and isinstance(g.get("index"), int)}
    if telemetry.get("available") and reported:
        indexes, source = sorted(reported), "NVML"
    elif name == lease_host:
        indexes, source = list(range(configured_count)), "APPLIANCE_GPU_COUNT"
    else:
        indexes, source = [], "no GPU inventory"
    slots = [GpuSlot(i, str(reported.get(i, {}).get("name", "")), reported.get(i, {}),
                     leases.get((name, i))) for i in indexes]
    beyond = [GpuSlot(i, "", {}, d) for (h, i), d in sorted(leases.items())
              if h == name and i not in indexes]
    return HostGpus(name=name, host=host, source=source, gpus=slots, beyond=beyond)


def jointoken_list() -> list[JoinToken]:
    return list(JoinToken.objects.select_related("created_by"))


def jointoken_usable_count(*, host_name: str) -> int:
    """The join tokens that could still join the host (a removal revokes them)."""
    return JoinToken.objects.filter(host_name=host_name, revoked_at__isnull=True, uses=0,
                                    expires_at__gt=timezone.now()).count()


def jointoken_state(*, token: JoinToken, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if token.uses:
        return "spent"  # a token joins once
    return "expired" if token.expires_at <= now else "usable"


def host_deployment_ids(*, host: FleetHost) -> list[int]:
    """The deployments placed on the host: all it may write events for."""
    return sorted(Placement.objects.filter(host=host).values_list("deployment_id", flat=True))


def engine_key(*, deployment_id: int, start_token: str) -> str:
    """The API key a remote engine is started with (SGLang's --api-key) and the gateway
    sends it: derived from the panel's secret and the start, so nothing is stored, a new
    start gets a new key, and only the panel and the host running that start know it."""
    message = f"engine-key:{deployment_id}:{start_token}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


# What a host is told of each engine placed on it: enough to start, follow and stop it.
PLACEMENT_FIELDS = ("id", "status", "spec", "image", "start_token", "log_cursor", "progress",
                    "gpus", "alerts", "restart_not_before", "engine_url", "rebuild_image")


def joined_host_of(*, deployment_id: int) -> str:
    """The name of the host other than the panel's own that the deployment is placed on
    ('' on the panel's own, or with no placement)."""
    return str(Placement.objects.filter(deployment_id=deployment_id).exclude(
        host__name=settings.HOST_NAME).values_list("host__name", flat=True).first() or "")


def placement_lock_digest(*, deployment: Deployment) -> str | None:
    """The recipe lock the host must find on the image's label; None for an image the
    operator configured (APPLIANCE_ENGINE_IMAGE), which no recipe built."""
    if settings.ENGINE_IMAGE and deployment.image == settings.ENGINE_IMAGE:
        return None
    try:
        path = recipe_lock_path(recipe_load(str((deployment.spec or {}).get("recipe", ""))))
    except (RecipeError, BuildError, OSError):
        return ""  # the recipe or its lock is gone: only an image without a lock matches
    return lock_digest(path.read_bytes()) if path is not None else ""


def host_placements(*, host: FleetHost) -> list[dict[str, Any]]:
    """The engines placed on the host that its agent acts on (starting to stopping), each
    as the agent needs it, and nothing else: no other deployment, no ended one, no user,
    key or secret value (the spec names its secrets only)."""
    rows = []
    images: frozenset[str] | None = None
    # The panel's own host's engines take no key: they are on the appliance's engine
    # network, reached by container name only, and the benchmark, check and Tune workers
    # call them directly, keyless, as they always did.
    keyed = host.name != settings.HOST_NAME
    for placement in Placement.objects.filter(
            host=host, deployment__status__in=AGENT_OWNED).select_related("deployment"):
        d = placement.deployment
        images = simulator_images() if images is None else images
        row: dict[str, Any] = {name: getattr(d, name) for name in PLACEMENT_FIELDS}
        row["restart_not_before"] = (d.restart_not_before.isoformat()
                                     if d.restart_not_before else None)
        try:
            refused = deployment_models_refused(deployment=d)
        except SpecError as exc:
            # One row whose stored spec no longer reads (written by an older panel) must not
            # keep the host from its other engines: the agent refuses to start it, saying why.
            refused = [f"its stored spec does not read ({exc}); redeploy it with a valid spec"]
        row.update(replica=placement.replica, lock_digest=placement_lock_digest(deployment=d),
                   models_refused=refused,
                   simulated_build=simulated_build(deployment=d, image=d.image, images=images),
                   engine_key=engine_key(deployment_id=d.pk, start_token=d.start_token)
                   if d.start_token and keyed else "")
        rows.append(row)
    return rows


def deployment_status(*, deployment_id: int) -> str:
    return str(Deployment.objects.values_list("status", flat=True).get(pk=deployment_id))
