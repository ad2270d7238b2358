"""What a host's agent writes for the engines placed on it, each checked field by field and
scoped to its own rows: their events (the ingest, one statement per batch with the row's
cursor) and their status steps (through the lifecycle table); their engine monitors'
points and alerts are hostmetrics.py's. A host's credential names one FleetHost
(selectors.host_for_credential): nothing here writes a row that is not placed on it."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import secrets
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DataError, connection, transaction

from appliance.logs.cause import Diagnosis
from appliance.runtime.container_plan import container_name
from web.deployments.models import (
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

from .models import FleetHost, Placement
from .services import FleetError

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
