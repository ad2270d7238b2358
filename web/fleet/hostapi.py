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

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe

from appliance import jsontext
from web.deployments.services.installation import instance_id

from . import agentlease, heartbeat, hostmetrics, hostwrites, selectors, services
from .models import FleetHost

SESSION_HEADER = "HTTP_X_AGENT_SESSION"  # X-Agent-Session: the agent process's id


AUTHENTICATE = 'Bearer realm="appliance-host"'  # the WWW-Authenticate of every 401
NO_CREDENTIAL = "Send the host's credential: Authorization: Bearer sdh-..."
UNKNOWN_CREDENTIAL = ("This credential names no joined host (the host was removed, or joined "
                      "again and has a newer one): join again with a new join token.")

Answer = tuple[int, dict[str, Any]]  # an HTTP status and its JSON body


def refusal(status: int, detail: str, field: str | None = None) -> Answer:
    return status, ({field: [detail]} if field else {"detail": detail})


# What a host's write to one deployment is refused for: a bad field (400, named), a
# deployment not placed on this host (404), another start or another agent process (409).
WRITE_REFUSED = (services.FleetError, hostwrites.NotPlacedHere, hostwrites.StaleStart,
                 agentlease.AgentLeaseHeld)


def _write_refusal(exc: Exception) -> Answer:
    if isinstance(exc, services.FleetError):
        return refusal(400, str(exc), exc.field)
    if isinstance(exc, hostwrites.NotPlacedHere):
        return refusal(404, f"{exc}: a host writes only the deployments placed on it.")
    return refusal(409, str(exc))


def _error(status: int, detail: str, field: str | None = None) -> JsonResponse:
    return _response(refusal(status, detail, field))


def _response(answer: Answer) -> JsonResponse:
    status, body = answer
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = AUTHENTICATE
    return response


def _parsed(raw: bytes) -> dict[str, Any] | Answer:
    try:
        data = jsontext.loads(raw)
    except (ValueError, RecursionError):
        return refusal(400, "The body is not JSON (or nests too deep).")
    if not isinstance(data, dict):
        return refusal(400, "The body is a JSON object.")
    return data


def _body(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    data = _parsed(request.body)
    return _response(data) if isinstance(data, tuple) else data


def bearer(authorization: str) -> str:
    """The credential of an Authorization header's value ("" for no bearer one)."""
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _bearer(request: HttpRequest) -> str:
    return bearer(request.META.get("HTTP_AUTHORIZATION", ""))


def _host(request: HttpRequest) -> FleetHost | JsonResponse:
    credential = _bearer(request)
    if not credential:
        return _error(401, NO_CREDENTIAL)
    host = selectors.host_for_credential(credential=credential)
    if host is None:
        return _error(401, UNKNOWN_CREDENTIAL)
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
        agentlease.host_agent_check(host=found[0], session=_session(request))
        return JsonResponse(write(*found))
    except WRITE_REFUSED as exc:
        return _response(_write_refusal(exc))


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
        agentlease.host_agent_claim(host=host, session=_session(request))
    except services.FleetError as exc:
        return _error(400, str(exc), exc.field)
    except agentlease.AgentLeaseHeld as exc:
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
        "moved": hostwrites.host_step(host=host, deployment_id=deployment_id,
                                    step=hostwrites.host_step_from(body)),
        "status": selectors.deployment_status(deployment_id=deployment_id)})


@csrf_exempt
@require_POST
def host_events(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """The ingest (events_ingest) as a Django view. The panel's ASGI app answers these
    requests before Django (web/fleet/asgi.py) with the same function."""
    return _response(events_ingest(authorization=request.META.get("HTTP_AUTHORIZATION", ""),
                                   session=_session(request), deployment_id=deployment_id,
                                   raw=request.body))


def events_ingest(*, authorization: str, session: str, deployment_id: int,
                  raw: bytes) -> Answer:
    """{events: [[kind, payload], ...], row: {log_cursor, progress, decode_stats},
    start_token, after} for a deployment placed on this host -> {last_seq, stored: true};
    404 for any other deployment, 409 for another start. With `after` (the row's log cursor
    the batch follows) the batch is stored only while the row's cursor is that one, else
    {stored: false, log_cursor: the row's}: the agent skips what that cursor covers (a
    batch whose answer was lost is not stored again). Without `after` or `start_token` (an
    older agent) that check is not made.

    The refusals and their order are _placed_write's: 401, 400 (the body), 409 (another
    agent process), 400 (a field), 404, 409 (another start). The host, its lease and the
    placement are one statement (selectors.host_placed_for_credential), the batch another."""
    credential = bearer(authorization)
    if not credential:
        return refusal(401, NO_CREDENTIAL)
    found = selectors.host_placed_for_credential(credential=credential,
                                                 deployment_id=deployment_id)
    if found is None:
        return refusal(401, UNKNOWN_CREDENTIAL)
    host, placed = found
    services.host_credential_used(host=host)
    body = _parsed(raw)
    if isinstance(body, tuple):
        return body
    try:
        agentlease.host_agent_check(host=host, session=session)
        batch = hostwrites.event_batch_from(body)
        try:
            return 200, {"last_seq": hostwrites.host_events_append(
                host=host, deployment_id=deployment_id, batch=batch, placed=placed),
                "stored": True}
        except hostwrites.CursorMoved as moved:
            return 200, {"last_seq": moved.last_seq, "stored": False,
                         "log_cursor": moved.stored}
    except WRITE_REFUSED as exc:
        return _write_refusal(exc)


@csrf_exempt
@require_POST
def host_quiet(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{} once the agent's batches for a deployment placed on it have stopped for a second:
    the status reads' answers are stored as the last batch left the row -> {quiet: true}."""
    def write(host: FleetHost, body: dict[str, Any]) -> dict[str, Any]:
        hostwrites.host_batches_quiet(host=host, deployment_id=deployment_id)
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
    return JsonResponse({"released": agentlease.host_agent_release(
        host=found[0], session=_session(request))})


@csrf_exempt
@require_POST
def host_metrics(request: HttpRequest, deployment_id: int) -> JsonResponse:
    """{start_token, points, alerts, compact} from the engine monitor of the current start
    of a deployment placed on this host -> {stored}; 404 for any other deployment, 409 for
    another start."""
    return _placed_write(request, lambda host, body: {"stored": hostmetrics.host_metrics_store(
        host=host, deployment_id=deployment_id, batch=hostmetrics.metrics_batch_from(body))})
