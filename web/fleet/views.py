"""The panel's fleet pages: the hosts (GPUs, Docker, agent version, heartbeat, state; an
admin drains and removes) and the join tokens (an admin makes one, shown on the answer that
made it and never again, and revokes)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from . import heartbeat, selectors, services
from .permissions import can_manage_fleet, can_view_fleet
from .services import NewJoinToken


def _require_admin(request: HttpRequest) -> None:
    if not can_manage_fleet(request.user):
        raise PermissionDenied("Join tokens and changes to hosts are an admin's.")


@login_required
@require_safe
def host_list(request: HttpRequest) -> HttpResponse:
    if not can_view_fleet(request.user):
        raise PermissionDenied("You need the viewer role (or operator) to see hosts.")
    return render(request, "fleet/hosts.html", {
        "rows": selectors.host_rows(), "lost_after_s": heartbeat.host_lost_after_s(),
        "can_manage": can_manage_fleet(request.user)})


@login_required
@require_POST
def host_drain(request: HttpRequest, name: str) -> HttpResponse:
    _require_admin(request)
    draining = request.POST.get("draining", "1") == "1"
    try:
        services.host_set_draining(name=name, draining=draining)
    except services.FleetError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Host {name} is draining: nothing new is placed there; "
                         "its engines go on." if draining else
                         f"Host {name} takes new placements again.")
    return redirect("fleet:hosts")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def host_remove(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the confirm page (what removal ends); POST with confirm=yes: remove."""
    _require_admin(request)
    if request.method != "POST" or request.POST.get("confirm") != "yes":
        row = next((h for h in selectors.host_rows() if h.name == name and h.joined), None)
        if row is None:
            raise Http404(f"No joined host {name}.")
        return render(request, "fleet/confirm_remove.html", {
            "host": row, "tokens": selectors.jointoken_usable_count(host_name=name)})
    try:
        revoked = services.host_remove(name=name)
    except services.FleetError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Host {name} removed: its credential is refused from now "
                         f"on ({revoked} join token(s) for it revoked).")
    return redirect("fleet:hosts")


class JoinTokenForm(forms.Form):
    host_name = forms.SlugField(max_length=63, label="Host name",
                                help_text="The name the host joins under (its "
                                          "APPLIANCE_HOST_NAME), e.g. gpu-2.")
    ttl_hours = forms.IntegerField(min_value=1, max_value=services.TOKEN_TTL_MAX_H,
                                   initial=services.TOKEN_TTL_DEFAULT_H,
                                   label="Valid for (hours)")


_LOOPBACK = ("localhost", "127.0.0.1", "[::1]", "::1")


def _panel_url(request: HttpRequest) -> tuple[str, bool]:
    """The panel's address for a GPU host's APPLIANCE_PANEL_URL, and whether it is only this
    machine's own loopback name (a host elsewhere cannot reach it: the page says so)."""
    if settings.PUBLIC_URL:
        return settings.PUBLIC_URL, False
    url = request.build_absolute_uri("/").rstrip("/")
    return url, (urlsplit(url).hostname or "") in _LOOPBACK


def _tokens_page(request: HttpRequest, form: JoinTokenForm, shown: NewJoinToken | None = None,
                 status: int = 200) -> HttpResponse:
    now = timezone.now()
    tokens = [(t, selectors.jointoken_state(token=t, now=now))
              for t in selectors.jointoken_list()]
    panel_url, loopback = _panel_url(request)
    return render(request, "fleet/tokens.html", {
        "form": form, "tokens": tokens, "shown": shown.secret if shown else None,
        "shown_host": shown.token.host_name if shown else "",
        "panel_url": panel_url, "panel_url_loopback": loopback}, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def jointoken_page(request: HttpRequest) -> HttpResponse:
    _require_admin(request)
    if request.method != "POST":
        return _tokens_page(request, JoinTokenForm())
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        return _tokens_page(request, form, status=400)
    try:
        made = services.jointoken_create(host_name=form.cleaned_data["host_name"],
                                         ttl_hours=form.cleaned_data["ttl_hours"],
                                         created_by=request.user)
    except services.FleetError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        return _tokens_page(request, form, status=400)
    # Rendered, not redirected: the secret is on this one answer and nowhere after it.
    return _tokens_page(request, JoinTokenForm(), shown=made)


@login_required
@require_POST
def jointoken_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    _require_admin(request)
    if services.jointoken_revoke(token_id=token_id):
        messages.success(request, "Join token revoked: it joins no host from now on.")
    else:
        messages.error(request, "No such unrevoked join token.")
    return redirect("fleet:tokens")
