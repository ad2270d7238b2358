"""Reads: an engine agent that stopped reporting, and what its deployments show meanwhile.

A deployment's engine is watched by its host's agent alone (the row's `agent_id`). When
that agent is silent (its heartbeat on the host row, renewed every tick, is older than
APPLIANCE_AGENT_SILENT_S), nothing on the row is current any more: the status, the metrics
and the alerts are as of its last report. The pages and the API then show the deployment
as `unknown` with an `agent-silent` alert, derived here from the heartbeat at each read
(the stored status is kept as it is: the agent takes up where it left off when it
returns, and the pages show the stored status again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from .models import RUNNING_STATUSES, Deployment, DeploymentStatus
from .services.hostreports import HostReport, host_reports

UNKNOWN = "unknown"  # what a page shows for the status of a deployment whose agent is silent
WATCHED_STATUSES = frozenset(RUNNING_STATUSES | {DeploymentStatus.STOPPING})
AGENT_SILENT_FIX = (
    "Check the agent: `docker compose ps agent` and `docker compose logs agent`; start it "
    "again with `docker compose up -d agent`. Its engines keep running meanwhile, and it "
    "takes them back when it returns.")


@dataclass(frozen=True)
class Silence:
    """An agent that has not reported for `seconds` (at least APPLIANCE_AGENT_SILENT_S)."""

    agent_id: str
    last_seen: datetime
    seconds: float

    @property
    def since_text(self) -> str:
        at = self.last_seen.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"for {_duration(self.seconds)} (last report {at} UTC)"

    @property
    def summary(self) -> str:
        return (f"The engine agent {self.agent_id} is silent {self.since_text}: the status, "
                "metrics and alerts shown are as of its last report, not now.")

    @property
    def fix(self) -> str:
        return AGENT_SILENT_FIX

    def alert(self) -> dict[str, Any]:
        """As an alert of the page's Alerts card (the shape of alert_history's entries)."""
        return {"id": "agent-silent", "severity": "critical", "state": "firing",
                "summary": self.summary, "fix": self.fix, "raised_at": self.last_seen,
                "cleared_at": None}

    def to_dict(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "silent": True,
                "last_seen": self.last_seen.isoformat(), "silent_s": round(self.seconds, 1),
                "summary": self.summary, "fix": self.fix}

    def stable_dict(self) -> dict[str, Any]:
        """As the API's status reads carry it: nothing in it changes while the silence
        lasts (no running duration), so their ETag may stand for it."""
        at = self.last_seen.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        return {"agent_id": self.agent_id, "silent": True,
                "last_seen": self.last_seen.isoformat(),
                "summary": f"The engine agent {self.agent_id} is silent since {at} UTC: the "
                           "status, metrics and alerts shown are as of its last report, not now.",
                "fix": self.fix}


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def agents_last_seen() -> dict[str, datetime]:
    """Each agent's last host report (one query)."""
    return dict(host_reports().exclude(agent_id="").values_list("agent_id", "heartbeat_at"))


def row_silence(*, status: str, agent_id: str, last_seen: datetime | None,
                now: datetime) -> Silence | None:
    """deployment_silence from a row's columns and its agent's last report (`last_seen`,
    None where the agent has no host report: nothing to judge it by)."""
    if status not in WATCHED_STATUSES or not agent_id:
        return None
    return _silence(agent_id, last_seen, now)


def shown_body(data: dict[str, Any], silence: Silence | None) -> dict[str, Any]:
    """A status read's body as the API answers it: the row's own, or, while the agent
    watching it is silent, with `unknown` for its status and a `silence` object saying
    since when and what to do (the stored status is the pages' "last known")."""
    if silence is None:
        return data
    return {**data, "status": UNKNOWN, "silence": {**silence.stable_dict(),
                                                   "last_known_status": data.get("status")}}


def _silence(agent_id: str, last_seen: datetime | None, now: datetime) -> Silence | None:
    if last_seen is None:  # nothing heard from the agent yet: nothing to judge it by
        return None
    seconds = (now - last_seen).total_seconds()
    if seconds < settings.AGENT_SILENT_S:
        return None
    return Silence(agent_id, last_seen, seconds)


def host_silence(*, host: HostReport, now: datetime | None = None) -> Silence | None:
    """The host's agent, when it is silent."""
    return _silence(host.agent_id, host.heartbeat_at, now or timezone.now())


def deployment_silence(*, deployment: Deployment, seen: Mapping[str, datetime] | None = None,
                       now: datetime | None = None) -> Silence | None:
    """The agent watching the deployment, when it is silent; None when it reports or no
    agent watches it (queued, building, stopped, failed).

    The agent's host report says when it was last heard (FleetHost.heartbeat_at)."""
    if deployment.status not in WATCHED_STATUSES or not deployment.agent_id:
        return None
    seen = agents_last_seen() if seen is None else seen
    return row_silence(status=deployment.status, agent_id=deployment.agent_id,
                       last_seen=seen.get(deployment.agent_id), now=now or timezone.now())


def deployments_silence(*, deployments: Iterable[Deployment],
                        now: datetime | None = None) -> dict[int, Silence]:
    """deployment_silence for many deployments, by id (one query)."""
    seen, now = agents_last_seen(), now or timezone.now()
    found = {d.pk: deployment_silence(deployment=d, seen=seen, now=now) for d in deployments}
    return {pk: s for pk, s in found.items() if s is not None}
