"""Panel pages: list, new, hosts, detail. Business logic stays in services."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from web.deployments import logpane, rows, selectors, services
from web.deployments.engine_limits import engine_limits
from web.deployments.listing import row_texts
from web.deployments.models import TERMINAL_STATUSES, Deployment
from web.deployments.permissions import can_delete, can_deploy, can_stop, can_view
from web.deployments.services.rolling import rolling_shown
from web.deployments.silence import deployment_silence
from web.fleet.selectors import hosts_gpu_board, hosts_list
from web.gateway.playground_views import how_to_call
from web.gateway.selectors import gateway_base_url

from . import services as deploying
from .forms import DeploymentForm
from .lifecycle_views import form_source

LIST_REFRESH_S = 5  # how often the list page asks for its rows again


def _while(status: str) -> str:
    """The CSS class of a flash that is true only while the deployment has this status."""
    return f"while-{status}"


def _require_view(request: HttpRequest) -> None:
    if not can_view(request.user):
        raise PermissionDenied("You need the viewer role (or operator) to see deployments; "
                               "ask an admin to add you to a group.")


@login_required
@require_safe
def deployment_list(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    return render(
        request,
        "deployments/list.html",
        {"rows": _list_rows(request), "refresh_s": LIST_REFRESH_S,
         "can_deploy": can_deploy(request.user), "hosts": hosts_list()},
    )


@login_required
@require_safe
def deployment_list_rows(request: HttpRequest) -> HttpResponse:
    """The list's rows as JSON, for the page's refresh (list.js): one query however long."""
    _require_view(request)
    return JsonResponse({"deployments": _list_rows(request), "refresh_s": LIST_REFRESH_S})


def _list_rows(request: HttpRequest) -> list[dict[str, Any]]:
    # The Endpoint of a serving deployment is the gateway's, with the model clients name.
    base = gateway_base_url(request=request)
    return [row_texts(row, gateway=base)
            for row in rows.deployment_list_rows(now=timezone.now())]


@login_required
def deployment_new(request: HttpRequest) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to deploy.")
    # ?recipe=NAME starts the form from that recipe's defaults (the page's script does the same
    # when the choice changes); only listed recipe names are taken. ?from=<id> fills it from
    # that deployment's spec (Clone), &fix=1 with its diagnosis' fix applied (Redeploy).
    source = form_source(request)
    form = DeploymentForm(request.POST or None,
                          recipe=source.initial["recipe"] if source else request.GET.get("recipe"),
                          initial=source.initial if source else None)
    findings: list[dict[str, str]] = []
    checked_on = ""  # the host (or hosts) placement chose and pre-flight checked
    # &redeploy=1: the form runs the source deployment on its new spec, in place (rolling
    # with replicas: deploying.deployment_redeploy) instead of creating another.
    redeploy = int(str(request.GET["from"])) if source and request.GET.get("redeploy") == "1" \
        else None
    if request.method == "POST" and form.is_valid() and redeploy is not None:
        try:
            deployment = deploying.deployment_redeploy(
                deployment_id=redeploy, data=form.to_spec(), user=request.user,
                confirm_warnings=form.cleaned_data["confirm_warnings"],
                rebuild_image=form.cleaned_data["rebuild_image"])
        except services.DeploymentInputError as exc:
            form.add_service_errors(exc.errors)
            findings, checked_on = [f.to_dict() for f in exc.findings], exc.host
        else:
            text = (deployment.rolling or {}).get("text") if (
                deployment.rolling or {}).get("state") == "rolling" else None
            messages.success(request, f"{deployment.name}: {text or 'redeploy queued'}.")
            return redirect("deployments:detail", pk=deployment.pk)
    elif request.method == "POST" and form.is_valid():
        try:
            deployment = deploying.deployment_create(
                data=form.to_spec(),
                user=request.user,
                confirm_warnings=form.cleaned_data["confirm_warnings"],
                rebuild_image=form.cleaned_data["rebuild_image"],
            )
        except services.DeploymentInputError as exc:
            form.add_service_errors(exc.errors)
            findings, checked_on = [f.to_dict() for f in exc.findings], exc.host
        else:
            # Tagged with the status it reports: the detail page drops it once the live status
            # moves on, so "queued" does not sit above a ready engine.
            messages.success(request, f"Deployment {deployment.name} queued.",
                             extra_tags=_while(deployment.status))
            return redirect("deployments:detail", pk=deployment.pk)
    status = 400 if request.method == "POST" else 200
    return render(
        request, "deployments/new.html",
        {"form": form, "findings": findings, "checked_on": checked_on, "source": source,
         "redeploy": redeploy},
        status=status,
    )


@login_required
@require_safe
def host_list(request: HttpRequest) -> HttpResponse:
    """Each GPU host's GPUs and the deployment that holds each (its GPU lease)."""
    _require_view(request)
    board = hosts_gpu_board(lease_host=settings.HOST_NAME, configured_count=settings.GPU_COUNT)
    return render(request, "deployments/hosts.html", {"board": board})


@login_required
@require_safe
def deployment_agent(request: HttpRequest, pk: int) -> HttpResponse:
    """Whether the deployment's agent is silent, for the detail page's poll (detail.js): a
    silent agent sends nothing down the page's live stream, so the page asks."""
    _require_view(request)
    deployment = get_object_or_404(
        Deployment.objects.only("status", "agent_id", "replica_of", "rolling",
                                "spec"), pk=pk)
    silence = deployment_silence(deployment=deployment)
    # Its engines as the Replicas table shows them (each replica's `unknown` included): a
    # replica's moves go down its own stream and a lost host sends none, so the page asks.
    replicas = ([] if deployment.replica_of_id else
                rows.deployment_replicas(deployment=deployment, now=timezone.now()))
    return JsonResponse({
        "status": deployment.status, "silence": silence.to_dict() if silence else None,
        "replicas": [{**r.to_dict(), "url": reverse("deployments:detail", args=[r.id])}
                     for r in replicas] if len(replicas) > 1 else [],
        "replicas_heading": _replicas_heading(deployment, replicas),
        "replicas_throughput": rows.replicas_throughput(replicas=replicas),
        "rolling": rolling_shown(rolling=deployment.rolling or {})})


def _replicas_heading(deployment: Deployment, replicas: list[rows.ReplicaRow]) -> str:
    """The Replicas card's count: the spec's (what Scale last set, as its message says),
    and the rows beyond it that are still stopping; stopped rows are listed, not counted."""
    wanted = int((deployment.spec or {}).get("replicas") or 1)
    stopping = [r.index for r in replicas
                if r.index >= wanted and r.status not in TERMINAL_STATUSES]
    heading = f"{wanted} replica{'s' if wanted != 1 else ''}"
    if stopping:
        heading += f" ({', '.join(map(str, stopping))} stopping)"
    return heading


@login_required
@require_safe
def deployment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    _require_view(request)
    deployment = get_object_or_404(Deployment, pk=pk)
    silence = deployment_silence(deployment=deployment)
    replicas = rows.deployment_replicas(deployment=deployment, now=timezone.now())
    deployment.rolling = rolling_shown(rolling=deployment.rolling or {})  # shown, not saved
    return render(
        request,
        "deployments/detail.html",
        {
            "deployment": deployment,
            # Its agent is silent: shown as unknown with an alert (detail.js asks again).
            "silence": silence,
            "silence_data": silence.to_dict() if silence else None,
            "summary": selectors.deployment_summary(deployment=deployment),
            # The page opens at the tail (the row read above says up to where) and its
            # stream goes on from there; older lines come from deployment_events on demand.
            "tail": [e.to_wire() for e in logpane.event_tail(
                deployment_id=deployment.pk, last_seq=deployment.last_seq)],
            "can_stop": can_stop(request.user),
            "can_deploy": can_deploy(request.user),
            "can_delete": can_delete(request.user),
            # A Tune running its candidates in this deployment's place, and until when
            # (the row's tune_hold, which the Tune writes when it takes the row and empties
            # when it gives it back).
            "tune_hold": dict(deployment.tune_hold) or None,
            # Restart rolls when replica 0 has replicas; a replica row restarts alone.
            "replica_count": 1 if deployment.replica_of_id else len(replicas),
            "runs": selectors.deployment_runs(deployment=deployment),
            "findings": selectors.deployment_findings(deployment=deployment),
            "call": how_to_call(request=request, deployment=deployment),
            # What its engine build refuses (log-probs, grammar), and where that is known from.
            "limits": engine_limits(deployment=deployment),
            # Its engines (replica 0 and its replica rows) and their summed throughput.
            "replicas": replicas if len(replicas) > 1 else [],
            "replicas_heading": _replicas_heading(deployment, replicas),
            "replicas_throughput": rows.replicas_throughput(replicas=replicas),
        },
    )
