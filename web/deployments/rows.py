"""The rows a deployment shows as: a line of the list page (one query for the whole list)
and its replicas' table (its page and the API's replicas list), each with its latest
throughput while it is ready and fresh, and UNKNOWN while its host's agent is silent."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.fields.json import KeyTextTransform

from .models import Deployment, DeploymentStatus, MetricPoint
from .silence import UNKNOWN, Silence, agents_last_seen, deployment_silence

# ------------------------------------------------------------------ the list page
#
# One query for the whole list, however long: the latest metric point of each row comes
# from two correlated subqueries on the (deployment, ts) index, not a query per row.

LIST_ROWS = 200
THROUGHPUT_FRESH = timedelta(seconds=60)  # an older point is not "current" throughput
_LIST_FIELDS = ("id", "name", "status", "algorithm", "recipe", "gpus", "created_at",
                "ready_at", "engine_url", "agent_id")


@dataclass(frozen=True)
class DeploymentRow:
    id: int
    name: str
    status: str
    algorithm: str
    recipe: str
    gpus: list[int]
    created_at: datetime
    ready_at: datetime | None  # while ready: when it became ready
    uptime_s: float | None  # while ready: seconds since ready_at
    throughput: float | None  # while ready: output tok/s of a point under a minute old
    throughput_at: datetime | None  # that point's time
    endpoint: str  # while ready: the engine's address on the engines' network
    # Its agent is silent (silence.py): the status shown is `unknown`, this says why.
    silent: str = ""
    replicas: str = ""  # "3 replicas (2 ready)"; empty for one engine
    model: str = ""  # the `model` clients name: the spec's served_model_name, else the name


def deployment_list_rows(*, now: datetime, limit: int = LIST_ROWS) -> list[DeploymentRow]:
    """The newest `limit` deployments with what the list shows of each, in one query (and
    one more for the agents' reports, one for the replica rows where there are any)."""
    latest = MetricPoint.objects.filter(deployment=OuterRef("pk")).order_by("-ts")
    # Replica rows are shown by their replica 0 ("3 replicas (2 ready)"), not as rows.
    ready = Q(replica_rows__status=DeploymentStatus.READY)
    rows = list(Deployment.objects.filter(replica_of__isnull=True).only(*_LIST_FIELDS)
                .annotate(point_throughput=Subquery(latest.values("throughput")[:1]),
                          point_ts=Subquery(latest.values("ts")[:1]),
                          served_name=KeyTextTransform("served_model_name",
                                                       KeyTextTransform("engine", "spec")),
                          replica_count=Count("replica_rows"),
                          replicas_ready=Count("replica_rows", filter=ready))[:limit])
    seen = agents_last_seen()
    silences = {d.pk: deployment_silence(deployment=d, seen=seen, now=now) for d in rows}
    silent = _silent_replicas([d.pk for d in rows if getattr(d, "replica_count", 0)],
                              seen, now)
    return [dataclasses.replace(_list_row(d, now, silences[d.pk]), replicas=_replicas_text(
                d, root_silent=silences[d.pk] is not None, silent=silent.get(d.pk, (0, 0))),
                model=str(getattr(d, "served_name", None) or d.name))
            for d in rows]


def _silent_replicas(roots: list[int], seen: dict[str, datetime],
                     now: datetime) -> dict[int, tuple[int, int]]:
    """Per replica 0 of `roots`: how many of its replica rows' agents are silent (their
    status reads `unknown`), and how many of those are stored ready (so not counted ready).
    One query, none without roots."""
    found: dict[int, tuple[int, int]] = {}
    if not roots:
        return found
    for d in Deployment.objects.filter(replica_of_id__in=roots).only(
            "replica_of_id", "status", "agent_id"):
        if d.replica_of_id is not None and deployment_silence(
                deployment=d, seen=seen, now=now) is not None:
            silent, ready = found.get(d.replica_of_id, (0, 0))
            found[d.replica_of_id] = (silent + 1,
                                      ready + (d.status == DeploymentStatus.READY))
    return found


def _replicas_text(d: Deployment, *, root_silent: bool = False,
                   silent: tuple[int, int] = (0, 0)) -> str:
    """"3 replicas (2 ready)", with "1 unknown" where agents are silent: a row whose agent
    is silent never counts as ready, whatever it last reported."""
    extra = getattr(d, "replica_count", 0)
    if not extra:
        return ""
    ready = (getattr(d, "replicas_ready", 0) - silent[1]
             + (d.status == DeploymentStatus.READY and not root_silent))
    unknown = silent[0] + root_silent
    return (f"{extra + 1} replicas ({ready} ready"
            f"{f', {unknown} unknown' if unknown else ''})")


def _list_row(d: Deployment, now: datetime, silence: Silence | None = None) -> DeploymentRow:
    if silence is not None:  # nothing on the row is current: no uptime or throughput either
        return DeploymentRow(
            id=d.pk, name=d.name, status=UNKNOWN, algorithm=d.algorithm, recipe=d.recipe,
            gpus=list(d.gpus or []), created_at=d.created_at, ready_at=None, uptime_s=None,
            throughput=None, throughput_at=None, endpoint="",
            silent=f"last known {d.status}. {silence.summary}")
    ready = d.status == DeploymentStatus.READY and d.ready_at is not None
    point_ts: datetime | None = getattr(d, "point_ts", None)
    fresh = ready and point_ts is not None and now - point_ts <= THROUGHPUT_FRESH
    return DeploymentRow(
        id=d.pk, name=d.name, status=d.status, algorithm=d.algorithm, recipe=d.recipe,
        gpus=list(d.gpus or []), created_at=d.created_at,
        ready_at=d.ready_at if ready else None,
        uptime_s=max(0.0, (now - d.ready_at).total_seconds()) if ready and d.ready_at else None,
        throughput=getattr(d, "point_throughput", None) if fresh else None,
        throughput_at=point_ts if fresh else None,
        endpoint=d.engine_url if ready else "",
    )


# ------------------------------------------------------------------ replicas


@dataclass(frozen=True)
class ReplicaRow:
    """One engine of a deployment as its page and the API's replicas list show it."""

    id: int
    index: int
    host: str
    gpus: list[int]
    status: str
    run: int
    placement_reason: str
    throughput: float | None  # decode tok/s of its latest metric point, while ready and fresh

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "index": self.index, "host": self.host, "gpus": self.gpus,
                "status": self.status, "run": self.run,
                "placement_reason": self.placement_reason, "throughput": self.throughput}


def deployment_replicas(*, deployment: Deployment, now: datetime) -> list[ReplicaRow]:
    """Replica 0 (the deployment the row belongs to) and its replica rows, by index, each
    with its latest throughput (Deployment.latest_metrics: no series read)."""
    root = deployment.replica_of_id or deployment.pk
    rows = (Deployment.objects.filter(pk=root) | Deployment.objects.filter(replica_of_id=root))
    fields = ("id", "replica_index", "host", "gpus", "status", "run", "placement_reason",
              "latest_metrics", "agent_id")
    seen = agents_last_seen()
    return [_replica_row(d, now, deployment_silence(deployment=d, seen=seen, now=now))
            for d in rows.only(*fields).order_by("replica_index")]


def _replica_row(d: Deployment, now: datetime, silence: Silence | None = None) -> ReplicaRow:
    if silence is not None:  # its host's agent is silent (a lost host): nothing is current
        return ReplicaRow(id=d.pk, index=d.replica_index, host=d.host, gpus=list(d.gpus or []),
                          status=UNKNOWN, run=d.run, placement_reason=d.placement_reason,
                          throughput=None)
    point = d.latest_metrics or {}
    at = point.get("t")
    fresh = (d.status == DeploymentStatus.READY and isinstance(at, int | float)
             and now.timestamp() - at <= THROUGHPUT_FRESH.total_seconds())
    value = point.get("throughput") if fresh else None
    return ReplicaRow(id=d.pk, index=d.replica_index, host=d.host, gpus=list(d.gpus or []),
                      status=d.status, run=d.run, placement_reason=d.placement_reason,
                      throughput=float(value) if isinstance(value, int | float) else None)


def replicas_throughput(*, replicas: list[ReplicaRow]) -> float | None:
    """The deployment's decode tok/s: its ready replicas' sum; None when none has a point."""
    values = [r.throughput for r in replicas if r.throughput is not None]
    return sum(values) if values else None
