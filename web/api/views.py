"""The REST API: deployments, stop, restart, redeploy, delete, clone, runs, paged events, a status
summary, pre-flight."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from django.utils import timezone
from django.utils.cache import get_conditional_response, patch_cache_control, patch_vary_headers
from django.utils.http import quote_etag
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action, api_view, parser_classes, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.logs.cause import spec_patched
from appliance.runtime import series
from web.deploy import checks
from web.deploy import services as deploying
from web.deployments import rows as deployment_rows
from web.deployments import selectors, services
from web.deployments.bodies import (
    READ_FIELDS,
    STATUS_READS,
    WATCH_FIELDS,
    status_etag,
    status_silence,
)
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.permissions import can_delete, can_deploy, can_stop, can_view
from web.deployments.serializers import DeploymentSerializer, deployment_data
from web.deployments.silence import deployments_silence, shown_body

from . import metrics
from .pagination import bounded_int
from .parsers import SPEC_PARSERS, spec_body
from .schema import CREATE_SCHEMA, spec_request
from .selectors import deployment_for_token
from .serializers import (
    DeploymentCreateSerializer,
    EventSerializer,
    PreflightSerializer,
    ScaleSerializer,
)

MAX_SEQ = 2**63 - 1  # an event seq is a PostgreSQL bigint
class CanOperate(permissions.BasePermission):
    message = ("You need the viewer role to read deployments, the operator role to deploy, "
               "stop, restart or delete.")

    def has_permission(self, request: Request, view: Any) -> bool:
        action = getattr(view, "action", None)
        if request.method in permissions.SAFE_METHODS:
            return can_view(request.user)  # clone too: the spec, as the deployment shows it
        if action in ("stop", "restart", "scale"):
            return can_stop(request.user)
        if action == "destroy":
            return can_delete(request.user)
        return can_deploy(request.user)


class DeploymentViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Deployment],
):
    serializer_class = DeploymentSerializer
    permission_classes = [permissions.IsAuthenticated, CanOperate]
    parser_classes = SPEC_PARSERS

    def get_queryset(self) -> Any:
        wanted = self.request.query_params.get("status")
        if wanted and wanted not in DeploymentStatus.values:
            raise ValidationError({"status": [
                f"Unknown status; use one of: {', '.join(DeploymentStatus.values)}."]})
        # The status reads carry the row's version: their ETag (conditional()).
        deployments = selectors.deployment_list(
            status=wanted, versioned=self.action in ("retrieve", "summary"))
        if self.action in READ_FIELDS:  # one row by its key: no sort, only what is shown
            # (and what says whether its agent is silent, in the same query)
            deployments = (deployments.order_by()
                           .only(*dict.fromkeys(READ_FIELDS[self.action] + WATCH_FIELDS))
                           .annotate(agent_seen=selectors.agent_seen()))
        return deployments

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The deployments, newest first; a row whose agent is silent reads `unknown`."""
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        rows = list(queryset) if page is None else page
        silent = deployments_silence(deployments=rows)
        data = [shown_body(deployment_data(d), silent.get(d.pk)) for d in rows]
        return Response(data) if page is None else self.get_paginated_response(data)

    @extend_schema(responses={200: DeploymentSerializer, 304: None})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One deployment. Send its ETag back as If-None-Match: 304 while it is unchanged."""
        deployment = self.get_object()
        return conditional(request, deployment, "detail", lambda: deployment_data(deployment))

    @extend_schema(**CREATE_SCHEMA)
    def create(self, request: Request) -> Response:
        body = DeploymentCreateSerializer(data=spec_body(request.data, request.query_params))
        body.is_valid(raise_exception=True)
        deployment = deploying.deployment_create(
            data=body.validated_data["spec"],
            user=request.user,
            confirm_warnings=body.validated_data["confirm_warnings"],
            rebuild_image=body.validated_data["rebuild_image"],
        )
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        deployment = services.deployment_stop(deployment_id=self.get_object().pk)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str | None = None) -> Response:
        """Start a stopped or failed deployment again: same spec, same id, a new run. With
        replicas, a rolling restart, one replica at a time, whatever their status."""
        deployment = services.deployment_restart(deployment_id=self.get_object().pk,
                                                  user=request.user)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ScaleSerializer, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, pk: str | None = None) -> Response:
        """Run this many engines of the deployment's spec (replica 0's id): missing
        replicas are placed and started, the highest-index ones beyond are stopped."""
        body = ScaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        deployment = deploying.deployment_scale(deployment_id=self.get_object().pk,
                                                replicas=body.validated_data["replicas"],
                                                user=request.user)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def replicas(self, request: Request, pk: str | None = None) -> Response:
        """The deployment's engines (replica 0 and its replica rows): index, host, GPUs,
        status, run, why it was placed there and its throughput, and their sum."""
        rows = deployment_rows.deployment_replicas(deployment=self.get_object(), now=timezone.now())
        return Response({"results": [r.to_dict() for r in rows],
                         "throughput": deployment_rows.replicas_throughput(replicas=rows)})

    @extend_schema(**{**CREATE_SCHEMA, "responses": {202: DeploymentSerializer},
                      "description": "Redeploy: the body as for create (the new spec). The "
                      "name and the replica count stay; with replicas, so do their GPUs."})
    @action(detail=True, methods=["post"])
    def redeploy(self, request: Request, pk: str | None = None) -> Response:
        """Run this deployment on a new spec (or rebuild_image: a new image), same id. With
        replicas, one replica at a time (`rolling` shows how far); with one, as restart."""
        body = DeploymentCreateSerializer(data=spec_body(request.data, request.query_params))
        body.is_valid(raise_exception=True)
        deployment = deploying.deployment_redeploy(
            deployment_id=self.get_object().pk, data=body.validated_data["spec"],
            user=request.user, confirm_warnings=body.validated_data["confirm_warnings"],
            rebuild_image=body.validated_data["rebuild_image"])
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a stopped or failed deployment with its events, runs and metric series."""
        services.deployment_delete(deployment_id=self.get_object().pk)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        parameters=[OpenApiParameter("fix", bool, description="Apply the diagnosis' fix.")],
        responses={200: dict})
    @action(detail=True, methods=["get"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        """This deployment's spec to deploy again (POST it to /api/deployments/); with
        ?fix=true the diagnosis' fix applied, and the patch that did it."""
        deployment = self.get_object()
        fixable = (deployment.diagnosis or {}).get("patch") or {}
        patch = fixable if request.query_params.get("fix") in ("1", "true") else {}
        spec = spec_patched(deployment.spec, patch) if patch else deployment.spec
        return Response({"spec": spec, "patch": patch, "fixable": bool(fixable)})

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def runs(self, request: Request, pk: str | None = None) -> Response:
        """Each start of the engine with the seqs of its events (first_seq..last_seq)."""
        return Response({"results": selectors.deployment_runs(deployment=self.get_object())})

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Only events with seq greater than this."),
            OpenApiParameter("limit", int, description="At most this many (1-1000)."),
            OpenApiParameter("run", int, description="Only this run's events (see runs/)."),
        ],
        responses={200: EventSerializer(many=True)},
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        after = bounded_int(request, "after", 0, 0, MAX_SEQ)
        limit = bounded_int(request, "limit", 500, 1, 1000)
        last = MAX_SEQ
        if "run" in request.query_params:
            run = _run_of(deployment, bounded_int(request, "run", 1, 1, 2**31 - 1))
            after, last = max(after, run["first_seq"] - 1), run["last_seq"]
        events = [e for e in selectors.events_after(
            deployment_id=deployment.pk, after_seq=after, limit=limit) if e.seq <= last]
        next_after = events[-1].seq if len(events) == limit and events[-1].seq < last else None
        return Response(
            {"results": EventSerializer(events, many=True).data, "next_after": next_after}
        )

    @extend_schema(responses={200: dict, 304: None})
    @action(detail=True, methods=["get"])
    def summary(self, request: Request, pk: str | None = None) -> Response:
        """Status, progress, alerts, the latest metrics: the row alone (its writers keep it
        current). Send its ETag back as If-None-Match: 304 while it is unchanged."""
        deployment = self.get_object()
        return conditional(request, deployment, "summary",
                           lambda: selectors.deployment_summary(deployment=deployment))

    @extend_schema(parameters=metrics.PARAMETERS, responses={200: metrics.MetricSeriesSerializer})
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """The engine's metric series (throughput, acceptance, requests, latency, GPUs)."""
        deployment = self.get_object()
        start, end, step = metrics.series_query(request)
        points = selectors.metric_series(deployment_id=deployment.pk, start=start, end=end,
                                         step=step)
        return Response({"deployment": deployment.pk, "start": start.timestamp(),
                         "end": end.timestamp(), "step": step, "units": series.UNITS,
                         "points": [p.to_dict() for p in points]})


def conditional(request: Request | HttpRequest, deployment: Deployment, name: str,
                body: Callable[[], Any]) -> Response:
    """A representation of the deployment row with an ETag, or 304 Not Modified when the
    request's If-None-Match has it (django.utils.cache). The ETag is the row's version, so
    a 304 costs no serializing; without one (not PostgreSQL), a digest of the body."""
    silence = status_silence(deployment=deployment)  # `unknown` while its agent is silent
    versioned = status_etag(deployment=deployment, name=name, silence=silence)
    data = shown_body(body(), silence) if versioned is None else None
    etag = versioned or quote_etag(
        f"{name}-{hashlib.sha256(JSONRenderer().render(data)).hexdigest()[:32]}")
    unchanged = get_conditional_response(request, etag=etag)  # 304 (or 412 for If-Match)
    if unchanged is not None:
        response = Response(status=unchanged.status_code)
    else:
        response = Response(shown_body(body(), silence) if data is None else data)
    response["ETag"] = etag
    # Per user (token or session), and always asked again: a client keeps the body and
    # sends the ETag, never uses a stored copy unasked.
    patch_cache_control(response, private=True, no_cache=True)
    return response


# Accept headers DRF's negotiation answers with JSONRenderer's plain output; any other (the
# browsable API's text/html, a JSON indent, a list) goes the whole way.
PLAIN_JSON = frozenset({"*/*", "application/json"})
_JSON = JSONRenderer()


def status_read(url_name: str, viewset_view: Callable[..., HttpResponseBase],
                ) -> Callable[..., HttpResponseBase]:
    """The router's view for a status read, with a token GET answered from one prepared
    statement (web/api/selectors.py) instead of DRF's dispatch, authentication and
    permissions and three ORM queries (the profile: 3 ms of CPU a read, /healthz
    0.8 ms). The answer is the viewset's: the same body, ETag and 304, headers. Anything
    else, and every refusal (401, 403, 404), is the viewset's own (`viewset_view`)."""
    action, name, body = STATUS_READS[url_name]
    headers = _viewset_headers(viewset_view)

    @wraps(viewset_view)  # the viewset's attributes: csrf_exempt, and cls for the schema
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        pk = str(kwargs.get("pk", ""))
        if (request.method == "GET" and not request.META.get("QUERY_STRING")
                and request.META.get("HTTP_ACCEPT", "*/*") in PLAIN_JSON
                and pk.isascii() and pk.isdigit() and len(pk) <= 18):
            deployment = deployment_for_token(request=request, deployment_id=int(pk),
                                              fields=READ_FIELDS[action])
            if deployment is not None:
                return _as_viewset_answers(
                    conditional(request, deployment, name, lambda: body(deployment)), headers)
        return viewset_view(request, *args, **kwargs)
    return view


def _viewset_headers(viewset_view: Any) -> dict[str, str]:
    """What the viewset adds to each answer (APIView.default_response_headers: Allow, and
    Vary: Accept), for its view as the router made it."""
    viewset = viewset_view.cls(**viewset_view.initkwargs)
    actions = dict(viewset_view.actions)
    if "get" in actions:
        actions.setdefault("head", actions["get"])  # as ViewSetMixin.as_view does
    for method, handler in actions.items():
        setattr(viewset, method, getattr(viewset, handler))
    return dict(viewset.default_response_headers)


def _as_viewset_answers(response: Response, headers: dict[str, str]) -> Response:
    """The Response as DRF's finalize_response leaves it (rendered by JSONRenderer, as its
    negotiation picks for these Accept headers)."""
    response.accepted_renderer = _JSON
    response.accepted_media_type = _JSON.media_type
    response.renderer_context = {}  # type: ignore[attr-defined]  # as finalize_response
    extra = dict(headers)
    if vary := extra.pop("Vary", None):
        patch_vary_headers(response, [v.strip() for v in vary.split(",")])
    for key, value in extra.items():
        response[key] = value
    return response


def _run_of(deployment: Deployment, number: int) -> dict[str, Any]:
    run = next((r for r in selectors.deployment_runs(deployment=deployment)
                if r["number"] == number), None)
    if run is None:
        raise ValidationError({"run": [f"{deployment.name} has runs 1 to {deployment.run}."]})
    return run


@extend_schema(request=spec_request(flags=False), responses={200: dict})
@api_view(["POST"])
@parser_classes(SPEC_PARSERS)
@permission_classes([permissions.IsAuthenticated])
def preflight(request: Request) -> Response:
    """Validate a spec, place it and run the pre-flight rules against the host placement
    chose, without deploying (the same bodies as creating a deployment: JSON or YAML, a
    bare spec or {"spec": ...}). `host` names the host checked; `placement` says where
    each replica would run and why (a read: another request may take those GPUs first)."""
    body = PreflightSerializer(data=spec_body(request.data, {}))
    body.is_valid(raise_exception=True)
    checked = checks.deployment_check(data=body.validated_data["spec"])
    return Response({"findings": [f.to_dict() for f in checked.findings], "ok": True,
                     "host": checked.host,
                     "placement": [{"replica": c.replica, "host": c.host, "gpus": c.gpus,
                                    "reason": c.reason} for c in checked.choices]})
