"""What a GPU host's agent calls: the join (with a join token), then with its own credential
(`Authorization: Bearer sdh-...`) its heartbeat, its placements, its engines' status steps
and the ingest of their events (appliance/runtime/remote_agent.py is the caller).

Plain Django views, not DRF's: no session or cookie is read (so no CSRF applies), and the
ingest is the hot path of a busy host (thousands of events a second), where DRF's parsing
and checks per request would be most of the cost. A host's credential is accepted here and
nowhere else: the user API's authentication does not know it, and these views know no
other.

One agent process writes for a host at a time: its placements read (`GET host/`) claims
the host for the session it sends (`X-Agent-Session`, a random id per process) for
FLEET_AGENT_LEASE_S, and the writes of any other session are refused with 409 until that
lease has run out. An agent that sends no session (older than the lease) is served as
before while no session holds the host.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe

from web.deployments.services.installation import instance_id

from . import heartbeat, selectors, services
from .models import FleetHost

SESSION_HEADER = "HTTP_X_AGENT_SESSION"  # X-Agent-Session: the agent process's id


def _error(status: int, detail: str, field: str | None = None) -> JsonResponse:
    body: dict[str, Any] = {field: [detail]} if field else {"detail": detail}
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="appliance-host"'
    return response


def _body(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    try:
        data = json.loads(request.body)
    except (ValueError, RecursionError):
        return _error(400, "The body is not JSON (or nests too deep).")
    if not isinstance(data, dict):
        return _error(400, "The body is a JSON object.")
    return data


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _host(request: HttpRequest) -> FleetHost | JsonResponse:
    credential = _bearer(request)
    if not credential:
        return _error(401, "Send the host's credential: Authorization: Bearer sdh-...")
    host = selectors.host_for_credential(credential=credential)
    if host is None:
        return _error(401, "This credential names no joined host (the host was removed, or "
                      "joined again and has a newer one): join again with a new join token.")
    services.host_credential_used(host=host)
    return host


def _host_and_body(request: HttpRequest) -> tuple[FleetHost, dict[str, Any]] | JsonResponse:
    """The host the credential names, then the body: the first refusal of the two."""
    host = _host(request)
    if isinstance(host, JsonResponse):
        return host
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    return host, body


def _session(request: HttpRequest) -> str:
    return str(request.META.get(SESSION_HEADER, "")).strip()


def _placed_write(request: HttpRequest,
                  write: Callable[[FleetHost, dict[str, Any]], dict[str, Any]]) -> JsonResponse:
    """The answer of a host's write to one deployment (`write` given the host and the body),
    or its refusal: 401 for no host's credential, 400 for a body that is no JSON object or a
    bad field (named), 404 for a deployment not placed on this host (not 403: a host learns
    nothing of deployments that are not its own), 409 for a start that is no longer the
    current one or while another agent process holds the host."""
    found = _host_and_body(request)
    if isinstance(found, JsonResponse):
        return found
    try:
        services.host_agent_check(host=found[0], session=_session(request))
        return JsonResponse(write(*found))
    except services.FleetError as exc:
        return _error(400, str(exc), exc.field)
    except services.NotPlacedHere as exc:
        return _error(404, f"{exc}: a host writes only the deployments placed on it.")
    except (services.StaleStart, services.AgentLeaseHeld) as exc:
        return _error(409, str(exc))


def _host_answer(host: FleetHost) -> dict[str, Any]:
    return {"host": host.name, "draining": host.draining,
            "heartbeat_s": settings.FLEET_HEARTBEAT_S,
            "lost_after_s": heartbeat.host_lost_after_s(),
            "deployments": selectors.host_deployment_ids(host=host)}


@csrf_exempt
@require_POST
def host_join(request: HttpRequest) -> JsonResponse:
    """{token, name, agent_version, gpus | gpu_count, docker, secret_names} -> 201 with the
    host's credential (in this answer only)."""
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    token = body.get("token") or _bearer(request)
    if not isinstance(token, str) or not token:
        return _error(400, "Send the join token (token) an admin made for this host.", "token")
    try:
        facts = services.host_facts_from(body)
        joined = services.host_join(token=token, name=str(body.get("name") or ""),
                                    facts=facts)
    except services.FleetError as exc:
        return _error(400, str(exc), exc.field)
    except services.JoinRefused as exc:
        return _error(403, str(exc))
    return JsonResponse({**_host_answer(joined.host), "credential": joined.credential},
                        status=201)


@csrf_exempt
@require_POST
def host_heartbeat(request: HttpRequest) -> JsonResponse:
    found = _host_and_body(request)
    if isinstance(found, JsonResponse):
        return found
    host, body = found
    try:
        facts = services.host_facts_from(body)
    except services.FleetError as exc:
        return _error(400, str(exc), exc.field)
    return JsonResponse(_host_answer(services.host_heartbeat(host=host, facts=facts)))


@require_safe
def host_me(request: HttpRequest) -> JsonResponse:
    """This host, with each engine placed on it (id, spec, image, start token, status,
    the recipe lock its image must carry, the engine's API key for this start). The read
    claims (or renews) the host for the agent process's session: 409 while another's lease
    runs."""
    host = _host(request)
    if isinstance(host, JsonResponse):
        return host
    try:
        services.host_agent_claim(host=host, session=_session(request))
    except services.FleetError as exc:
        return _error(400, str(exc), exc.field)
    except services.AgentLeaseHeld as exc:
        return _error(409, str(exc))
    # The install's id: the host's engines carry it, so a restarted agent adopts them.
    return JsonResponse({**_host_answer(host), "instance_id": instance_id(),
                         "placements": selectors.host_placements(host=host),
                         "monitor": {"interval_s": settings.METRICS_INTERVAL_S,
                                     "stall_s": settings.ALERT_STALL_S}})


@csrf_exempt
@require_POST
def host_step(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{step, start_token, engine_url | diagnosis, message, last_lines} for the current
    start of a deployment placed on this host -> {moved, status}; 404 for any other."""
    return _placed_write(request, lambda host, body: {
        "moved": services.host_step(host=host, deployment_id=deployment_id,
                                    step=services.host_step_from(body)),
        "status": selectors.deployment_status(deployment_id=deployment_id)})


@csrf_exempt
@require_POST
def host_events(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{events: [[kind, payload], ...], row: {log_cursor, progress, decode_stats},
    start_token, after} for a deployment placed on this host -> {last_seq, stored: true};
    404 for any other deployment, 409 for another start. With `after` (the row's log cursor
    the batch follows) the batch is stored only while the row's cursor is that one, else
    {stored: false, log_cursor: the row's}: the agent skips what that cursor covers (a
    batch whose answer was lost is not stored again). Without `after` or `start_token` (an
    older agent) that check is not made."""
    def write(host: FleetHost, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"last_seq": services.host_events_append(
                host=host, deployment_id=deployment_id,
                batch=services.event_batch_from(body)), "stored": True}
        except services.CursorMoved as moved:
            return {"last_seq": moved.last_seq, "stored": False, "log_cursor": moved.stored}

    return _placed_write(request, write)


@csrf_exempt
@require_POST
def host_quiet(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{} once the agent's batches for a deployment placed on it have stopped for a second:
    the status reads' answers are stored as the last batch left the row -> {quiet: true}."""
    def write(host: FleetHost, body: dict[str, Any]) -> dict[str, Any]:
        services.host_batches_quiet(host=host, deployment_id=deployment_id)
        return {"quiet": True}

    return _placed_write(request, write)


@csrf_exempt
@require_POST
def host_release(request: HttpRequest) -> JsonResponse:
    """{} from an agent process that stops: its lease on the host ends now, so the next
    agent process takes over at once -> {released: whether it held it}."""
    found = _host_and_body(request)
    if isinstance(found, JsonResponse):
        return found
    return JsonResponse({"released": services.host_agent_release(
        host=found[0], session=_session(request))})


@csrf_exempt
@require_POST
def host_metrics(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{start_token, points, alerts, compact} from the engine monitor of the current start
    of a deployment placed on this host -> {stored}; 404 for any other deployment, 409 for
    another start."""
    return _placed_write(request, lambda host, body: {"stored": services.host_metrics_store(
        host=host, deployment_id=deployment_id, batch=services.metrics_batch_from(body))})
