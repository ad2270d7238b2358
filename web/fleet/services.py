"""Writes for the fleet: join tokens made (shown once) and revoked, a host's join (its own
credential, shown once to its agent), its heartbeat, drain, removal, placements, and the
events a host stores for the engines placed on it.

What a host's credential may do is what these functions let it: it names one FleetHost
(selectors.host_for_credential) and every write below is scoped to that row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DataError, IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from appliance.logs.cause import Diagnosis
from appliance.runtime import strays
from appliance.runtime.alerts import Alert
from appliance.runtime.containers import container_name
from appliance.runtime.series import MetricPoint
from web.deployments.models import (
    ACTIVE_STATUSES,
    Deployment,
    DeploymentStatus,
    EventKind,
)
from web.deployments.services import events_append_batch, events_batches_quiet
from web.deployments.services.installation import instance_id
from web.deployments.services.lifecycle import (
    ADVANCE,
    deployment_mark_failed,
    deployment_mark_ready,
    deployment_mark_stopped,
    deployment_restart_after_death,
)
from web.deployments.services.metrics import (
    deployment_apply_alerts,
    metrics_compact,
    metrics_store_point,
)

from .models import FleetHost, GpuLease, JoinToken, Placement

JOIN_PREFIX = "sdj-"
CREDENTIAL_PREFIX = "sdh-"
PREFIX_LENGTH = 8
TOKEN_TTL_DEFAULT_H = 24
TOKEN_TTL_MAX_H = 24 * 30
MAX_AGENT_VERSION = 64
MAX_GPUS = 64
# What a host may append to a deployment's log: what its follower makes of engine output
# (appliance.runtime.follower). Status, phase, build, alert and end events are the panel's.
# A host builds its engines' images itself (appliance/runtime/host_image.py): their build
# events too.
HOST_EVENT_KINDS = frozenset({EventKind.LOG, EventKind.METRIC, EventKind.PROGRESS,
                              EventKind.SELFCHECK, EventKind.DIAGNOSIS, EventKind.BUILD})
MAX_BATCH_EVENTS = 20_000
MAX_TEXT = 16_384  # one log line's characters; SGLang's longest lines are far shorter
HOST_ROW_FIELDS = frozenset({"log_cursor", "progress", "decode_stats"})
MAX_CURSOR = 40  # the follower's cursor text (appliance.runtime.follower.Cursor), marked
MAX_SESSION = 64  # an agent process's session id (the X-Agent-Session header)
KEPT_LEASE_SHARE = 2 / 3  # a lease with more left than this share of it is not renewed


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
            "reason": "" if facts.gpu_source == "nvml" else "a GPU count, no NVML"}


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
    return HostFacts(agent_version=version, gpus=gpus, gpu_source=source, docker=docker,
                     secret_names=sorted(set(names)),
                     foreign_containers=_strays_from(body.get("foreign_containers")))


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


class AgentLeaseHeld(PermissionError):
    """Another agent process of this host holds it: its writes alone are taken."""


def _lease_held_by_another(host: FleetHost, session: str, now: Any) -> bool:
    return bool(host.agent_session and host.agent_session != session
                and host.agent_lease_until is not None and host.agent_lease_until >= now)


def _lease_refusal(host: FleetHost) -> AgentLeaseHeld:
    until = host.agent_lease_until
    return AgentLeaseHeld(
        f"another agent process of host {host.name} (session {host.agent_session[:8]}...) "
        f"holds it until {until:%H:%M:%S} UTC: one agent writes for a host. This one waits "
        "for that lease to run out (the other stopped renewing it) and takes over then; "
        "if two agents run for this host, stop one.")


def host_agent_claim(*, host: FleetHost, session: str) -> None:
    """The placements read by the agent process `session` holds the host for it for
    FLEET_AGENT_LEASE_S, renewed once a third of it is spent (each renewal writes the row);
    AgentLeaseHeld while another session's lease runs. An agent that dies leaves at least
    two thirds of its lease to run before another takes its engines over."""
    if not session:
        return  # an agent that sends no session (older than the lease) claims nothing
    if not (isinstance(session, str) and len(session) <= MAX_SESSION):
        raise FleetError("X-Agent-Session", f"the session is up to {MAX_SESSION} characters")
    now = timezone.now()
    lease = timedelta(seconds=settings.FLEET_AGENT_LEASE_S)
    if (host.agent_session == session and host.agent_lease_until is not None
            and host.agent_lease_until >= now + lease * KEPT_LEASE_SHARE):
        return
    free = (Q(agent_session=session) | Q(agent_lease_until__isnull=True)
            | Q(agent_lease_until__lt=now))
    until = now + lease
    if not FleetHost.objects.filter(pk=host.pk).filter(free).update(
            agent_session=session, agent_lease_until=until):
        host.refresh_from_db(fields=["agent_session", "agent_lease_until"])
        raise _lease_refusal(host)
    host.agent_session, host.agent_lease_until = session, until


def host_agent_check(*, host: FleetHost, session: str) -> None:
    """AgentLeaseHeld when another agent process holds the host (a write from a session
    without a lease, or from none, is taken while no other's lease runs). Read from the row
    the credential loaded: a write under way across a takeover is caught by what it
    carries (a batch's `after`, a step's start and the lifecycle table)."""
    if _lease_held_by_another(host, session, timezone.now()):
        raise _lease_refusal(host)


def host_agent_release(*, host: FleetHost, session: str) -> bool:
    """An agent process that stops gives its lease back, so the next one takes the host at
    once; whether it held it."""
    if not session:
        return False
    return FleetHost.objects.filter(pk=host.pk, agent_session=session).update(
        agent_lease_until=timezone.now()) > 0


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


# -------------------------------------------------------------------- a host's events


class NotPlacedHere(PermissionError):
    """The host asked to write a deployment that is not placed on it (or does not exist)."""


@dataclass(frozen=True)
class EventBatch:
    events: list[tuple[str, dict[str, Any]]]
    row: dict[str, Any]
    # None: not sent (an agent older than these checks): stored as before, unconditionally.
    start_token: str | None = None
    after: str | None = None  # the row's log cursor this batch follows


class CursorMoved(Exception):  # noqa: N818 - an answer, not an error
    """The row's log cursor is not the one the batch follows: nothing was stored."""

    def __init__(self, stored: str, last_seq: int) -> None:
        super().__init__(stored)
        self.stored = stored
        self.last_seq = last_seq


def event_batch_from(body: Mapping[str, Any]) -> EventBatch:
    """A host's batch as sent: {"events": [[kind, payload], ...], "row": {...}, "start_token",
    "after"}, checked."""
    events = body.get("events")
    if not isinstance(events, list) or not 0 < len(events) <= MAX_BATCH_EVENTS:
        raise FleetError("events", f"send 1 to {MAX_BATCH_EVENTS} events as [kind, payload] "
                         "pairs")
    checked = [_event_checked(i, e) for i, e in enumerate(events)]
    row = body.get("row") or {}
    if not isinstance(row, dict) or not set(row) <= HOST_ROW_FIELDS:
        raise FleetError("row", f"row may set only {', '.join(sorted(HOST_ROW_FIELDS))}")
    cursor = row.get("log_cursor")
    if cursor is not None and not (isinstance(cursor, str) and len(cursor) <= MAX_CURSOR):
        raise FleetError("row", "log_cursor is the follower's cursor text (40 characters "
                         "at most)")
    for name in ("progress", "decode_stats"):
        if name in row and not isinstance(row[name], dict):
            raise FleetError("row", f"{name} is an object")
    token, after = body.get("start_token"), body.get("after")
    if token is not None and not (isinstance(token, str) and 0 < len(token) <= 64):
        raise FleetError("start_token", "send the start token of the engine these events "
                         "are from")
    if after is not None and not (isinstance(after, str) and len(after) <= MAX_CURSOR):
        raise FleetError("after", "after is the row's log cursor this batch follows, as the "
                         "last answer or the placement gave it (40 characters at most)")
    return EventBatch(events=checked, row=dict(row), start_token=token, after=after)


def _event_checked(i: int, event: Any) -> tuple[str, dict[str, Any]]:
    if not (isinstance(event, list) and len(event) == 2 and isinstance(event[1], dict)):
        raise FleetError("events", f"event {i} is not a [kind, payload] pair")
    kind, payload = event
    if kind not in HOST_EVENT_KINDS:
        raise FleetError("events", f"event {i}: a host may append "
                         f"{', '.join(sorted(HOST_EVENT_KINDS))} events, not {kind!r}")
    text = payload.get("text")
    if text is not None and not (isinstance(text, str) and len(text) <= MAX_TEXT):
        raise FleetError("events", f"event {i}: text is a string of {MAX_TEXT} characters "
                         "at most")
    return str(kind), payload


def host_events_append(*, host: FleetHost, deployment_id: int, batch: EventBatch,
                       placed: bool | None = None) -> int:
    """Store a host's batch for a deployment placed on it, with the row's fields; the last
    seq. In the same statement, as the row holds them:
    the start the batch names (StaleStart for another) and the cursor it follows
    (CursorMoved with the row's cursor for another: a batch sent again after its answer was
    lost is then stored once). NotPlacedHere for any other deployment. `placed`: whether
    it is placed on the host, where the caller read that with the host (else read here)."""
    if placed is None:
        placed = Placement.objects.filter(host=host, deployment_id=deployment_id).exists()
    if not placed:
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    expect = {name: value for name, value in (("start_token", batch.start_token),
                                              ("log_cursor", batch.after)) if value is not None}
    # Inside a caller's transaction a savepoint keeps it usable after a refused batch; on
    # its own (the ingest view) the batch is one statement that commits or not by itself.
    guard = transaction.atomic() if connection.in_atomic_block else nullcontext()
    try:
        with guard:
            return events_append_batch(deployment_id=deployment_id, events=batch.events,
                                       row=batch.row, expect=expect)
    except DataError as exc:  # JSON that PostgreSQL's jsonb refuses; nothing was stored
        raise FleetError("events", "a payload holds what the database cannot store (a "
                         "\\u0000, a lone surrogate, NaN or Infinity): "
                         f"{str(exc).splitlines()[0][:200]}") from None
    except Deployment.DoesNotExist:
        pass
    # Refused: why, from the row as it is now.
    found = Deployment.objects.filter(pk=deployment_id).values_list(
        "start_token", "log_cursor", "last_seq").first()
    if found is None:
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    token, cursor, last_seq = found
    if batch.start_token is not None and not (
            token and secrets.compare_digest(token, batch.start_token)):
        raise StaleStart(f"deployment {deployment_id} is no longer on that start (it was "
                         "restarted or redeployed): these events are an engine's that is gone")
    if batch.after is None:  # nothing else could refuse it: the row went meanwhile
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    raise CursorMoved(cursor, last_seq)


def host_batches_quiet(*, host: FleetHost, deployment_id: int) -> None:
    """A host's batches for a deployment placed on it have stopped for now: the status
    reads' answers are stored at the row as the last batch left it (the batches may have
    reached other web processes, each of which stores at most twice a second)."""
    if not Placement.objects.filter(host=host, deployment_id=deployment_id).exists():
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    events_batches_quiet(deployment_id=deployment_id, always=True)



# -------------------------------------------------------------------- a host's status steps


class StaleStart(PermissionError):
    """The step names a start of the engine that is not the deployment's current one."""


# The steps a host's agent takes for an engine placed on it; each goes through lifecycle.py
# (the only writer of `status`), which refuses a move its table does not allow.
HOST_STEPS = frozenset({*ADVANCE, "failed", "stopped"})
MAX_MESSAGE = 2000
MAX_LAST_LINES = 60


@dataclass(frozen=True)
class HostStep:
    step: str
    start_token: str
    engine_url: str = ""
    diagnosis: Diagnosis | None = None
    message: str = ""
    last_lines: tuple[str, ...] = ()


def host_step_from(body: Mapping[str, Any]) -> HostStep:
    """A host's step as sent: {step, start_token, engine_url | diagnosis, message,
    last_lines}, checked field by field."""
    step, token = body.get("step"), body.get("start_token")
    if step not in HOST_STEPS:
        raise FleetError("step", f"step is one of {', '.join(sorted(HOST_STEPS))}")
    if not (isinstance(token, str) and 0 < len(token) <= 64):
        raise FleetError("start_token", "send the start token of the engine this step is for")
    message = body.get("message", "")
    if not (isinstance(message, str) and len(message) <= MAX_MESSAGE):
        raise FleetError("message", f"message is a string of {MAX_MESSAGE} characters at most")
    lines = body.get("last_lines", [])
    if not (isinstance(lines, list) and len(lines) <= MAX_LAST_LINES
            and all(isinstance(x, str) and len(x) <= MAX_TEXT for x in lines)):
        raise FleetError("last_lines", f"last_lines is a list of up to {MAX_LAST_LINES} lines")
    # Checked in host_step, which knows the host and the start (the own host's engines
    # are named, not addressed).
    url = body.get("engine_url", "") if step == "ready" else ""
    if not (isinstance(url, str) and len(url) <= MAX_ENGINE_URL):
        raise FleetError("engine_url", f"engine_url is a URL of {MAX_ENGINE_URL} characters "
                         "at most")
    diagnosis = _diagnosis_from(body.get("diagnosis")) if step == "failed" else None
    return HostStep(step=str(step), start_token=token, engine_url=url, diagnosis=diagnosis,
                    message=message, last_lines=tuple(lines))


MAX_ENGINE_URL = 300


def engine_url_checked(url: Any, *, engine_name: str = "") -> str:
    """A remote engine's URL as the gateway will call it: http://<IP>:<port>, an address of
    the host's panel-facing network; or, given `engine_name` (the panel's own host, whose
    engines sit on the engine network), http://<that engine container's name>:<port>. Any
    other name, or a loopback, link-local or unspecified address, is refused: the panel's
    gateway would otherwise relay /v1 to whatever a host names on the panel's own machine
    or network (its compose services answer by name)."""
    parts = urlsplit(url if isinstance(url, str) else "")
    fix = ("engine_url is http://<the host's APPLIANCE_HOST_ADVERTISE_ADDR>:<port>, an IP "
           "address the panel reaches the host at")
    try:
        port = parts.port
        named = bool(engine_name) and parts.hostname == engine_name.lower()
        address = None if named else ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        raise FleetError("engine_url", fix) from None
    if (parts.scheme != "http" or port is None or parts.path not in ("", "/") or parts.query
            or parts.username or (address is not None and (
                address.is_loopback or address.is_link_local or address.is_unspecified
                or address.is_multicast))):
        raise FleetError("engine_url", fix)
    return f"http://{parts.netloc}"


def _diagnosis_from(found: Any) -> Diagnosis:
    if not (isinstance(found, dict) and all(
            isinstance(found.get(k), str) and len(found[k]) <= MAX_MESSAGE
            for k in ("cause", "summary", "fix"))):
        raise FleetError("diagnosis", "diagnosis is an object with cause, summary and fix "
                         f"(strings of {MAX_MESSAGE} characters at most)")
    evidence = found.get("evidence") or {}
    if not isinstance(evidence, dict) or len(json.dumps(evidence, default=str)) > 8192:
        raise FleetError("diagnosis", "diagnosis.evidence is an object under 8 KiB")
    # The catalogue decides what is shown (lifecycle.py stores an unknown cause as such).
    return Diagnosis(found["cause"], found["summary"], found["fix"], evidence)


def host_step(*, host: FleetHost, deployment_id: int, step: HostStep) -> bool:
    """Take a host's step for an engine placed on it, for the deployment's current start
    only; whether the status moved (False: the table refused it, or another move won).
    NotPlacedHere for any other deployment, StaleStart for another start's step."""
    if not Placement.objects.filter(host=host, deployment_id=deployment_id).exists():
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    current = Deployment.objects.filter(pk=deployment_id).values_list(
        "start_token", "status").first()
    if current is None:
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    token, status = current
    if not (token and secrets.compare_digest(token, step.start_token)):
        raise StaleStart(f"deployment {deployment_id} is no longer on that start (it was "
                         "restarted or redeployed): this step is for an engine that is gone")
    if step.step == "ready":
        # The panel's own host's engine is reached on the engine network by its container
        # name: this start's, and no other name.
        own = host.name == settings.HOST_NAME
        step = dataclasses.replace(step, engine_url=engine_url_checked(
            step.engine_url, engine_name=container_name(
                str(deployment_id), instance_id(), token) if own else ""))
    # Whose engine it is, for the silence check (web/deployments/silence.py): this host's,
    # before the move and after it (a new run, as a replica's after its death, starts with
    # no agent: its row would not read unknown while this host is lost before it steps).
    Deployment.objects.filter(pk=deployment_id).update(agent_id=f"agent@{host.name}")
    moved = _host_move(deployment_id, status, step)
    Deployment.objects.filter(pk=deployment_id, agent_id="").update(
        agent_id=f"agent@{host.name}")
    return moved


def _host_move(deployment_id: int, status: str, step: HostStep) -> bool:
    if step.step == "ready":
        return deployment_mark_ready(deployment_id=deployment_id, engine_url=step.engine_url)
    if step.step in ADVANCE:
        return bool(ADVANCE[step.step](deployment_id=deployment_id))
    if step.step == "stopped":
        return deployment_mark_stopped(deployment_id=deployment_id)
    assert step.diagnosis is not None
    message = step.message or step.diagnosis.summary
    # Died while serving: the spec's restart policy may start it again, as on the panel's host.
    if status == DeploymentStatus.READY and deployment_restart_after_death(
            deployment_id=deployment_id, start_token=step.start_token,
            diagnosis=step.diagnosis, message=message):
        return True
    return deployment_mark_failed(deployment_id=deployment_id, diagnosis=step.diagnosis,
                                  last_lines=list(step.last_lines), message=message)


# ------------------------------------------------------------ a host's engine monitor


# What one metrics call may carry: a minute of points at the default 2 s interval, the
# alerts one step of the monitor raises or clears.
MAX_POINTS = 30
MAX_ALERTS = 20
POINT_AGE_S = 3600.0  # a point older than this (or from the future) is a clock gone wrong
ALERT_STATES = frozenset({"firing", "resolved"})
ALERT_SEVERITIES = frozenset({"info", "warning", "critical"})
_ALERT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_POINT_NUMBERS = tuple(name for name in MetricPoint.__dataclass_fields__
                       if name not in ("t", "gpus"))


@dataclass(frozen=True)
class MetricsBatch:
    """A host's engine monitor's report for one start: points for the series, alerts."""

    start_token: str
    points: list[MetricPoint]
    alerts: list[Alert]
    compact: bool = False


def metrics_batch_from(body: Mapping[str, Any], *, now: float | None = None) -> MetricsBatch:
    """{start_token, points: [MetricPoint as a dict], alerts: [Alert as a dict], compact},
    checked field by field: a point's numbers finite, its time within POINT_AGE_S of now."""
    token = body.get("start_token")
    if not (isinstance(token, str) and 0 < len(token) <= 64):
        raise FleetError("start_token", "send the start token of the engine these are for")
    points, alerts = body.get("points") or [], body.get("alerts") or []
    if not (isinstance(points, list) and len(points) <= MAX_POINTS):
        raise FleetError("points", f"points is a list of up to {MAX_POINTS} metric points")
    if not (isinstance(alerts, list) and len(alerts) <= MAX_ALERTS):
        raise FleetError("alerts", f"alerts is a list of up to {MAX_ALERTS} alerts")
    at = time.time() if now is None else now
    return MetricsBatch(start_token=token,
                        points=[_point_checked(i, p, at) for i, p in enumerate(points)],
                        alerts=[_alert_checked(i, a) for i, a in enumerate(alerts)],
                        compact=body.get("compact") is True)


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _point_checked(i: int, point: Any, now: float) -> MetricPoint:
    if not isinstance(point, dict) or not _number(point.get("t")):
        raise FleetError("points", f"point {i} is an object with its Unix time t")
    if not now - POINT_AGE_S <= point["t"] <= now + 60:
        raise FleetError("points", f"point {i}: t is {point['t']}, not within an hour of the "
                         "panel's clock (check the host's clock: NTP)")
    bad = [n for n in _POINT_NUMBERS if point.get(n) is not None and not _number(point[n])]
    if bad:
        raise FleetError("points", f"point {i}: {', '.join(bad)} must be finite numbers or "
                         "null")
    gpus = point.get("gpus") or []
    if not (isinstance(gpus, list) and len(gpus) <= MAX_GPUS and all(
            isinstance(g, list) and len(g) <= 16 and all(v is None or _number(v) for v in g)
            for g in gpus)):
        raise FleetError("points", f"point {i}: gpus is a list of up to {MAX_GPUS} lists of "
                         "numbers (one per GPU)")
    return MetricPoint.from_dict({**point, "gpus": gpus})


def _alert_checked(i: int, alert: Any) -> Alert:
    if not (isinstance(alert, dict) and isinstance(alert.get("id"), str)
            and _ALERT_ID.fullmatch(alert["id"]) and alert.get("state") in ALERT_STATES
            and alert.get("severity") in ALERT_SEVERITIES):
        raise FleetError("alerts", f"alert {i} is an object with id (a slug), state "
                         f"({' or '.join(sorted(ALERT_STATES))}) and severity "
                         f"({', '.join(sorted(ALERT_SEVERITIES))})")
    texts = [alert.get(k, "") for k in ("summary", "fix")]
    evidence = alert.get("evidence") or {}
    if not (all(isinstance(t, str) and len(t) <= MAX_MESSAGE for t in texts)
            and isinstance(evidence, dict) and len(json.dumps(evidence, default=str)) <= 8192):
        raise FleetError("alerts", f"alert {i}: summary and fix are strings of {MAX_MESSAGE} "
                         "characters at most, evidence an object under 8 KiB")
    return Alert(id=alert["id"], state=alert["state"], severity=alert["severity"],
                 summary=texts[0], fix=texts[1], evidence=evidence)


def host_metrics_store(*, host: FleetHost, deployment_id: int, batch: MetricsBatch) -> int:
    """Store a host's monitor report for the current start of an engine placed on it: the
    points stored.
    NotPlacedHere for any other deployment, StaleStart for another start's report."""
    if not Placement.objects.filter(host=host, deployment_id=deployment_id).exists():
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    token = Deployment.objects.filter(pk=deployment_id).values_list(
        "start_token", flat=True).first()
    if token is None:
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    if not (token and secrets.compare_digest(token, batch.start_token)):
        raise StaleStart(f"deployment {deployment_id} is no longer on that start (it was "
                         "restarted or redeployed): these metrics are an engine's that is gone")
    resolution = max(1, round(settings.METRICS_INTERVAL_S))
    for point in batch.points:
        metrics_store_point(deployment_id=deployment_id, point=point, resolution_s=resolution)
    deployment_apply_alerts(deployment_id=deployment_id, alerts=batch.alerts)
    if batch.compact:
        metrics_compact(deployment_id=deployment_id, now=time.time())
    return len(batch.points)
