"""Writes for the fleet: join tokens made (shown once) and revoked, a host's join (its own
credential, shown once to its agent), its heartbeat, drain, removal and placements. What a
host writes for the engines placed on it is hostwrites.py's (events, status steps) and
hostmetrics.py's (monitor points, alerts); which of its agent processes may write,
agentlease.py's.

What a host's credential may do is what these functions let it: it names one FleetHost
(selectors.host_for_credential) and every write is scoped to that row.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from appliance.runtime import strays
from web.deployments.models import (
    ACTIVE_STATUSES,
    Deployment,
)

from .models import FleetHost, GpuLease, JoinToken, Placement

JOIN_PREFIX = "sdj-"
CREDENTIAL_PREFIX = "sdh-"
PREFIX_LENGTH = 8
TOKEN_TTL_DEFAULT_H = 24
TOKEN_TTL_MAX_H = 24 * 30
MAX_AGENT_VERSION = 64
MAX_GPUS = 64
DRIVER_VERSION = re.compile(r"\d{1,4}(\.\d{1,4}){0,3}")


class FleetError(ValueError):
    """Bad input or a refused change: `field` names what to fix, the message says how."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class NoSuchHost(FleetError):
    """No joined host of that name."""


class JoinRefused(PermissionError):
    """A join token that does not let this host join; the message says why and what to do."""


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret(kind: str) -> tuple[str, str]:
    """(prefix, secret) with 256 random bits after a hex prefix that reads plainly in lists."""
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    return prefix, f"{kind}{prefix}{secrets.token_urlsafe(32)}"


# -------------------------------------------------------------------- join tokens


@dataclass(frozen=True)
class NewJoinToken:
    token: JoinToken
    secret: str  # shown once to the admin who made it; never stored


def host_name_checked(name: str) -> str:
    cleaned = (name or "").strip()
    if not cleaned or len(cleaned) > 63 or slugify(cleaned) != cleaned:
        raise FleetError("host_name", "a host name is 1 to 63 lowercase letters, digits and "
                         f"hyphens (e.g. gpu-2), not {cleaned[:80]!r}")
    return cleaned


def jointoken_create(*, host_name: str, created_by: Any = None,
                     ttl_hours: int = TOKEN_TTL_DEFAULT_H) -> NewJoinToken:
    """A token that lets the host `host_name` join, for `ttl_hours` (1 to 720)."""
    name = host_name_checked(host_name)
    if not 1 <= ttl_hours <= TOKEN_TTL_MAX_H:
        raise FleetError("ttl_hours", f"a join token lasts 1 to {TOKEN_TTL_MAX_H} hours")
    prefix, secret = _new_secret(JOIN_PREFIX)
    token = JoinToken.objects.create(
        host_name=name, prefix=prefix, digest=secret_digest(secret), created_by=created_by,
        expires_at=timezone.now() + timedelta(hours=ttl_hours))
    return NewJoinToken(token=token, secret=secret)


def jointoken_revoke(*, token_id: int) -> bool:
    """Revoke a join token at once; False when there is no such unrevoked token."""
    return JoinToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
        revoked_at=timezone.now()) > 0


# -------------------------------------------------------------------- the join


@dataclass(frozen=True)
class HostFacts:
    """What an agent reports of its host, at the join and with each heartbeat."""

    agent_version: str
    gpus: list[dict[str, Any]]
    gpu_source: str  # "nvml" or "count"
    docker: dict[str, Any]
    secret_names: list[str]
    # The host's strays (appliance.runtime.strays); None when the agent sent none (an older
    # agent, or one another process of its host holds): the row keeps what it has.
    foreign_containers: list[dict[str, Any]] | None = None
    driver_version: str | None = None  # NVML's, as "580.65.06"; None: no NVML, or not sent


@dataclass(frozen=True)
class Joined:
    host: FleetHost
    credential: str  # given to the joining agent once; never stored


def host_join(*, token: str, name: str, facts: HostFacts) -> Joined:
    """A host joins with a join token made for it: its row (new or, on a join again with a
    new token, the same) and a new credential; the old credential stops working. A token
    is spent by its join: a second use is refused, so a copied token cannot mint a
    credential that cuts the live host off."""
    host_name = host_name_checked(name)
    now = timezone.now()
    with transaction.atomic():
        join = JoinToken.objects.select_for_update().filter(
            digest=secret_digest(token or "")).first()
        _check_join(join, host_name, now)
        assert join is not None
        prefix, credential = _new_secret(CREDENTIAL_PREFIX)
        row = {"credential_prefix": prefix, "credential_digest": secret_digest(credential),
               "credential_made_at": now, "joined_with": join,
               **_fact_fields(facts, now, host_name)}
        # A row that reported without joining (the panel's own host) joins from now.
        FleetHost.objects.unjoined().filter(name=host_name).update(joined_at=now)
        host, _ = FleetHost.objects.update_or_create(name=host_name, defaults=row)
        JoinToken.objects.filter(pk=join.pk).update(
            used_by=host_name, last_used_at=now, uses=join.uses + 1,
            first_used_at=join.first_used_at or now)
    return Joined(host=host, credential=credential)


def _check_join(join: JoinToken | None, host_name: str, now: Any) -> None:
    if join is None:
        raise JoinRefused("This join token is not one the panel made (or it was mistyped): "
                          "ask an admin for a token on the panel's Join tokens page.")
    if join.revoked_at is not None:
        raise JoinRefused(f"This join token (sdj-{join.prefix}) was revoked: ask an admin "
                          "for a new one.")
    if join.uses or join.first_used_at is not None:
        at = join.first_used_at or join.last_used_at
        raise JoinRefused(
            f"This join token (sdj-{join.prefix}) was spent when host {join.used_by!r} joined "
            f"with it{f' at {at:%Y-%m-%d %H:%M} UTC' if at else ''}: a token is for one join. "
            "The host keeps the credential that join gave it; to join again (its stored "
            "credential lost), ask an admin for a new token on the panel's Join tokens page.")
    if join.expires_at <= now:
        raise JoinRefused(f"This join token (sdj-{join.prefix}) expired at "
                          f"{join.expires_at:%Y-%m-%d %H:%M} UTC: ask an admin for a new one.")
    if join.host_name != host_name:
        raise JoinRefused(f"This join token is for host {join.host_name!r}, not {host_name!r}: "
                          f"set APPLIANCE_HOST_NAME={join.host_name} on this host, or ask an "
                          "admin for a token for this name.")


def _telemetry(facts: HostFacts) -> dict[str, Any]:
    """A report's GPUs in the shape of an NVML snapshot (gpu_telemetry), as the reads take it."""
    return {"available": facts.gpu_source == "nvml", "gpus": facts.gpus,
            "reason": "" if facts.gpu_source == "nvml" else "a GPU count, no NVML",
            **({"driver_version": facts.driver_version} if facts.driver_version else {})}


def _fact_fields(facts: HostFacts, now: Any, name: str) -> dict[str, Any]:
    return {"agent_id": f"agent@{name}", "agent_version": facts.agent_version, "gpus": facts.gpus,
            "gpu_source": facts.gpu_source, "docker": facts.docker, "heartbeat_at": now,
            "gpu_telemetry": _telemetry(facts), "secret_names": facts.secret_names,
            **({} if facts.foreign_containers is None
               else {"foreign_containers": facts.foreign_containers})}


def host_facts_from(body: Mapping[str, Any]) -> HostFacts:
    """An agent's report as sent (the API's JSON), checked field by field."""
    version = body.get("agent_version")
    if not isinstance(version, str) or not 0 < len(version) <= MAX_AGENT_VERSION:
        raise FleetError("agent_version", f"send the agent's version, 1 to {MAX_AGENT_VERSION} "
                         "characters")
    gpus, source = _gpus_from(body.get("gpus"), body.get("gpu_count"))
    docker = body.get("docker", {})
    if not isinstance(docker, dict) or len(str(docker)) > 8192:
        raise FleetError("docker", "send Docker's facts as an object (runtimes, "
                         "server_version, nvidia), under 8 KiB")
    names = body.get("secret_names", [])
    if not (isinstance(names, list) and len(names) <= 256
            and all(isinstance(n, str) and 0 < len(n) <= 128 for n in names)):
        raise FleetError("secret_names", "send the secret store's names (never values) as "
                         "a list of up to 256 strings")
    driver = body.get("driver_version")
    if driver is not None and not (isinstance(driver, str) and DRIVER_VERSION.fullmatch(driver)):
        raise FleetError("driver_version", "send NVML's driver version as digits and dots "
                         "(580.65.06), or leave it out where NVML gives none")
    return HostFacts(agent_version=version, gpus=gpus, gpu_source=source, docker=docker,
                     secret_names=sorted(set(names)),
                     foreign_containers=_strays_from(body.get("foreign_containers")),
                     driver_version=driver)


def _strays_from(sent: Any) -> list[dict[str, Any]] | None:
    """The host's strays as its agent lists them (appliance.runtime.strays), checked."""
    if sent is None:
        return None
    if isinstance(sent, list) and len(sent) <= strays.MAX_STRAYS and all(
            isinstance(c, dict) and set(c) == {"name", "status", "labels"}
            and _text(c["name"], strays.MAX_NAME) and _text(c["status"], strays.MAX_STATUS, 0)
            and _stray_labels(c["labels"]) for c in sent):
        return [{"name": c["name"], "status": c["status"], "labels": c["labels"]} for c in sent]
    raise FleetError("foreign_containers", "send the host's stray containers as a list of up "
                     f"to {strays.MAX_STRAYS} objects, each with name, status and labels (the "
                     f"container's {strays.LABEL_PREFIX}* labels, up to {strays.MAX_LABELS}, "
                     "as strings)")


def _text(value: Any, most: int, least: int = 1) -> bool:
    return isinstance(value, str) and least <= len(value) <= most


def _stray_labels(labels: Any) -> bool:
    return isinstance(labels, dict) and len(labels) <= strays.MAX_LABELS and all(
        _text(k, strays.MAX_LABEL_KEY) and k.startswith(strays.LABEL_PREFIX)
        and _text(v, strays.MAX_LABEL_VALUE, 0) for k, v in labels.items())


def _gpus_from(gpus: Any, count: Any) -> tuple[list[dict[str, Any]], str]:
    if gpus is not None:
        if not (isinstance(gpus, list) and len(gpus) <= MAX_GPUS
                and all(isinstance(g, dict) and isinstance(g.get("index"), int) for g in gpus)):
            raise FleetError("gpus", f"send NVML's GPUs as a list of up to {MAX_GPUS} objects, "
                             "each with its index")
        kept = ("index", "name", "uuid", "memory_total_gb", "compute_capability")
        return [{k: g[k] for k in kept if k in g} for g in gpus], "nvml"
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= MAX_GPUS:
        return [{"index": i} for i in range(count)], "count"
    raise FleetError("gpus", "send the GPUs NVML lists (gpus) or, without NVML, their "
                     f"number (gpu_count, 0 to {MAX_GPUS})")


# -------------------------------------------------------------------- a joined host


def host_heartbeat(*, host: FleetHost, facts: HostFacts) -> FleetHost:
    """The host's agent reports: its facts now, and that it is alive."""
    now = timezone.now()
    fields = _fact_fields(facts, now, host.name)
    FleetHost.objects.filter(pk=host.pk).update(**fields)
    for name, value in fields.items():
        setattr(host, name, value)
    return host


def host_credential_used(*, host: FleetHost) -> None:
    """Stamp the credential's last use, at most once a minute (a busy host's every batch
    would otherwise write its row)."""
    now = timezone.now()
    last = host.credential_last_used_at
    if last is None or now - last > timedelta(minutes=1):
        FleetHost.objects.filter(pk=host.pk).update(credential_last_used_at=now)
        host.credential_last_used_at = now


def host_set_draining(*, name: str, draining: bool) -> FleetHost:
    """Drain a host (no new placements; its engines go on) or take it back."""
    host = FleetHost.objects.joined().filter(name=name).first()
    if host is None:
        raise NoSuchHost("name", f"no joined host {name!r}")
    FleetHost.objects.filter(pk=host.pk).update(
        draining=draining, drained_at=timezone.now() if draining else None)
    host.refresh_from_db()
    return host


def host_engines(*, name: str) -> list[Deployment]:
    """The deployments with an engine on the host now (or about to): placed there, holding
    its GPUs, or followed by its agent."""
    placed = Placement.objects.filter(host__name=name).values("deployment_id")
    leased = GpuLease.objects.filter(host=name).values("deployment_id")
    active = Deployment.objects.filter(status__in=ACTIVE_STATUSES)
    return list((active.filter(pk__in=placed) | active.filter(pk__in=leased)
                 | active.filter(agent_id=f"agent@{name}")).distinct().order_by("pk"))


def host_remove(*, name: str) -> int:
    """Remove a host that runs no engine: its credential is refused from then on, the
    tokens still able to join it are revoked, its report row goes. Returns the number of
    join tokens revoked. FleetError names the engines that keep it."""
    with transaction.atomic():
        host = FleetHost.objects.joined().select_for_update().filter(name=name).first()
        if host is None:
            raise NoSuchHost("name", f"no joined host {name!r}")
        engines = host_engines(name=name)
        if engines:
            listed = ", ".join(f"#{d.pk} {d.name} ({d.status})" for d in engines)
            raise FleetError("name", f"host {name} still runs {listed}: stop them first "
                             "(drain the host so that nothing new is placed there).")
        Placement.objects.filter(host=host).delete()  # ended deployments' placements
        host.delete()
        return JoinToken.objects.filter(host_name=name, revoked_at__isnull=True,
                                        expires_at__gt=timezone.now()).update(
            revoked_at=timezone.now())


# -------------------------------------------------------------------- placements


def placement_assign(*, deployment: Deployment, host_name: str, replica: int = 0,
                     reason: str = "") -> Placement:
    """Place a deployment's engine (replica `replica`) on a joined host that is not
    drained, in place of its placement on the panel's own host (joined or not).
    The choice of host is the caller's (the placement rules, the spec)."""
    host = FleetHost.objects.joined().filter(name=host_name).first()
    if host is None:
        raise NoSuchHost("host", f"no joined host {host_name!r}")
    if host.draining:
        raise FleetError("host", f"host {host_name} is draining: no new engine is placed "
                         "there; undrain it or choose another host")
    try:
        with transaction.atomic():
            Placement.objects.filter(deployment=deployment, replica=replica).exclude(
                host__in=FleetHost.objects.joined().exclude(name=settings.HOST_NAME)).delete()
            return Placement.objects.create(deployment=deployment, replica=replica, host=host,
                                            reason=reason[:300])
    except IntegrityError:
        raise FleetError("replica", f"replica {replica} of deployment #{deployment.pk} is "
                         "placed already") from None
