"""One agent process writes for a host at a time: the lease its placements read claims
(and renews), every other write checks, and a stopping agent gives back. A second process
of the same host (two agents started by mistake, or one restarted before the old one
ended) waits until the lease runs out, then takes the host's engines over."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from .models import FleetHost
from .services import FleetError

MAX_SESSION = 64  # an agent process's session id (the X-Agent-Session header)
KEPT_LEASE_SHARE = 2 / 3  # a lease with more left than this share of it is not renewed


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
