"""The only writer of a deployment's `status`: the moves of appliance.lifecycle, applied.

Each move is one conditional UPDATE on the statuses the table lets its process move from
(`filter(pk, status__in=sources)`), with the status time, the phase event, and, into a
terminal status, the GPU leases' release (through gpus.py, the hook web/fleet registers),
in one transaction; zero rows updated means another process won, and the caller is told
so (False). A restart is a move too: it closes the run that ended and opens the next
(models.Run), whose events run from its phase event.

The table itself (which status may follow which, and which process makes each move) is
appliance.lifecycle's, drawn in its docstring and in docs/architecture.md.
tests/web/test_status_writes.py fails when code anywhere else writes `status`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from appliance.engine.restart import backoff_s, restart_from
from appliance.lifecycle import Process, Status, sources_of
from appliance.logs.appliance_causes import without_lines
from appliance.logs.catalogue import catalogued
from appliance.logs.cause import Diagnosis

from ..models import TERMINAL_STATUSES, Deployment, Event, EventKind, Run
from . import gpus
from .events import events_append

S = Status
User = AbstractBaseUser | AnonymousUser | None

# What a new run starts without: the last run's engine, figures and verdict.
_FRESH_RUN: dict[str, Any] = {
    "progress": {}, "decode_stats": {}, "alerts": {}, "engine_url": "", "log_cursor": "",
    "ready_at": None, "agent_id": "",
}


def _transition(deployment_id: int, *, target: Status, by: Process, message: str = "",
                match: dict[str, Any] | None = None, event: dict[str, Any] | None = None,
                **fields: Any) -> Event | None:
    """Apply one move of the table; its phase event, or None when no row moved.

    `match` narrows the UPDATE further (the run whose engine died); `event` adds to the
    phase event's payload.
    """
    sources = sources_of(target, by=by)
    if not sources:
        raise ValueError(f"the {by} never moves a deployment to {target}")
    now = timezone.now()
    with transaction.atomic():
        updated = Deployment.objects.filter(
            pk=deployment_id, status__in=list(sources), **(match or {})).update(
            status=target, updated_at=now, **fields)
        if not updated:
            return None
        _note_status_time(deployment_id, target, now)
        if target in TERMINAL_STATUSES:
            gpus.release(deployment_id=deployment_id)  # ended: its GPUs are free
        return events_append(deployment_id=deployment_id, events=[
            (EventKind.PHASE, {"status": target, "message": message, **(event or {})})])[0]


def _note_status_time(deployment_id: int, status: str, now: Any) -> None:
    """When each status began (the phase durations); the UPDATE before holds the row."""
    times = Deployment.objects.values_list("status_times", flat=True).get(pk=deployment_id)
    Deployment.objects.filter(pk=deployment_id).update(
        status_times={**(times or {}), status: now.isoformat()})


def deployment_mark_building(*, deployment_id: int) -> bool:
    return bool(_transition(deployment_id, target=S.BUILDING, by=Process.BUILDER,
                            phase="build"))


def _placed_agent(deployment_id: int) -> dict[str, Any]:
    """The row's agent from a run's start where the row is placed on a joined host: that
    host's (`agent@<host>`, as its steps write it, web/fleet/hostwrites.host_step), so a host
    lost before its first step of the run leaves the row `unknown` in every read, not the
    `starting` it was left in. Nothing for a row of the panel's own host (its agent claims
    it)."""
    host = (Deployment.objects.filter(pk=deployment_id)
            .values_list("placements__host__name", flat=True).first())
    return {"agent_id": f"agent@{host}"} if host and host != settings.HOST_NAME else {}


def deployment_mark_starting(*, deployment_id: int, image: str, start_token: str = "") -> bool:
    return bool(_transition(deployment_id, target=S.STARTING, by=Process.BUILDER,
                            phase="start", image=image, start_token=start_token,
                            build_owner="", build_lease_until=None,
                            **_placed_agent(deployment_id)))


def deployment_mark_checking(*, deployment_id: int) -> bool:
    return bool(_transition(deployment_id, target=S.CHECKING, by=Process.AGENT,
                            phase="self_check"))


def deployment_mark_loading(*, deployment_id: int) -> bool:
    return bool(_transition(deployment_id, target=S.LOADING, by=Process.AGENT,
                            phase="weights"))


def deployment_mark_capturing(*, deployment_id: int) -> bool:
    return bool(_transition(deployment_id, target=S.CAPTURING, by=Process.AGENT,
                            phase="cuda_graph"))


def deployment_mark_ready(*, deployment_id: int, engine_url: str = "") -> bool:
    fields: dict[str, Any] = {"phase": "serving", "ready_at": timezone.now()}
    if engine_url:
        fields["engine_url"] = engine_url
    return bool(_transition(deployment_id, target=S.READY, by=Process.AGENT, **fields))


# The engine phases the follower reports (appliance.runtime.follower), each with its move.
ADVANCE: dict[str, Callable[..., bool]] = {
    S.CHECKING: deployment_mark_checking,
    S.LOADING: deployment_mark_loading,
    S.CAPTURING: deployment_mark_capturing,
    S.READY: deployment_mark_ready,
}


def deployment_mark_stopping(*, deployment_id: int, by: Process = Process.WEB,
                             message: str = "stop requested") -> bool:
    """Stopping: by web (Stop), or by a rolling change for the replica whose turn it is."""
    return bool(_transition(deployment_id, target=S.STOPPING, by=by, message=message))


def deployment_mark_stopped(*, deployment_id: int, by: Process = Process.AGENT,
                            match: dict[str, Any] | None = None) -> bool:
    """Stopped: by the agent once the engine is gone, by web for a deployment still queued."""
    done = _transition(deployment_id, target=S.STOPPED, by=by, phase="", match=match,
                       ended_at=timezone.now())
    if done:
        events_append(deployment_id=deployment_id, events=[(EventKind.END, {"status": S.STOPPED})])
    return bool(done)


def deployment_mark_build_stopped(*, deployment_id: int) -> bool:
    """Stopped by the build worker whose build a Stop cancelled, where no engine of the run
    ever started (no start token): no host's agent has anything to stop or to report."""
    return deployment_mark_stopped(deployment_id=deployment_id, by=Process.BUILDER,
                                   match={"start_token": ""})


def deployment_mark_failed(
    *,
    deployment_id: int,
    diagnosis: Diagnosis,
    last_lines: list[str],
    message: str = "",
    by: Process = Process.AGENT,
) -> bool:
    """Failed, carrying a diagnosis and the engine's last lines.

    The diagnosis is one of the failure catalogue's causes (UncataloguedCause otherwise),
    so the panel never shows a cause the catalogue does not list. The agent fails a running
    engine only: an engine that ends while a stop is under way has stopped, not failed. The
    build worker fails what it has not handed over yet.
    """
    if not last_lines:  # an agent that came back after the engine's lines: the stored ones
        last_lines = run_last_lines(deployment_id=deployment_id)
    if not last_lines:
        diagnosis = without_lines(diagnosis)
    stored = catalogued(diagnosis).to_dict()
    done = _transition(
        deployment_id, target=S.FAILED, by=by, message=message or diagnosis.summary,
        diagnosis=stored, last_lines=last_lines[-60:], ended_at=timezone.now())
    if done:
        events_append(
            deployment_id=deployment_id,
            events=[
                (EventKind.DIAGNOSIS, stored),
                (EventKind.END, {"status": S.FAILED, "message": message}),
            ],
        )
    return bool(done)


def run_last_lines(*, deployment_id: int, limit: int = 60) -> list[str]:
    """The current run's last `limit` engine lines as stored (its log events), oldest
    first: what a failure shows where its agent sent none (it followed the engine from a
    cursor, after the lines: an agent or its host restarted)."""
    run = Deployment.objects.filter(pk=deployment_id).values_list("run", flat=True).first() or 1
    first = (Run.objects.filter(deployment_id=deployment_id, number=run)
             .values_list("first_seq", flat=True).first() or 1)
    texts = (Event.objects.filter(deployment_id=deployment_id, kind=EventKind.LOG,
                                  seq__gte=first).order_by("-seq")
             .values_list("payload__text", flat=True)[:limit])
    return [str(t) for t in reversed(list(texts)) if t is not None]


# ------------------------------------------------------------------------- restarts


def _who(user: User) -> Any:
    return user if user is not None and user.is_authenticated else None


def _close_run(deployment: Deployment, *, outcome: str, diagnosis: Any) -> None:
    """Record how the current run ended; run 1 is written now if it never was."""
    Run.objects.get_or_create(deployment=deployment, number=1, defaults={
        "reason": Run.Reason.DEPLOY, "first_seq": 1, "started_at": deployment.created_at,
        "started_by": deployment.created_by})
    Run.objects.filter(deployment=deployment, number=deployment.run).update(
        outcome=outcome, diagnosis=diagnosis)


def _open_run(deployment: Deployment, *, reason: str, user: User, event: Event) -> None:
    """The new run's row; its events begin at the move's phase event."""
    Run.objects.create(deployment=deployment, number=deployment.run + 1, reason=reason,
                       first_seq=event.seq, started_at=timezone.now(), started_by=_who(user))


def deployment_mark_requeued(*, deployment: Deployment, user: User = None,
                             by: Process = Process.WEB, why: str = "restarted",
                             changes: dict[str, Any] | None = None) -> bool:
    """Restart's move: a stopped or failed deployment is queued again as its next run.

    The caller holds the row's lock (select_for_update) and has leased its GPUs again. A
    rolling change (by the roller) queues a replica's next run this way, `changes` holding
    a redeploy's new spec columns, written in the same UPDATE as the move.
    """
    number = deployment.run + 1
    who = getattr(user, "username", "") or "the API"
    with transaction.atomic():
        _close_run(deployment, outcome=deployment.status, diagnosis=deployment.diagnosis)
        fields: dict[str, Any] = {
            "phase": "", "run": F("run") + 1, "restarts": 0, "restart_not_before": None,
            "start_token": "", "diagnosis": None, "last_lines": [], "ended_at": None,
            "rebuild_image": False, "build_owner": "", "build_lease_until": None,
            "status_times": {}, **_FRESH_RUN, **(changes or {})}
        event = _transition(
            deployment.pk, target=S.QUEUED, by=by, event={"run": number},
            message=f"run {number} queued: {why} by {who}", **fields)
        if event is None:
            return False
        _open_run(deployment, reason=Run.Reason.RESTART, user=user, event=event)
    return True


def deployment_serves_a_set(*, deployment: Deployment) -> str:
    """What the row is, where it is one engine of a set that exists to serve ('' where it
    is a deployment of its own): "a replica" (replica 0 with replica rows, or a replica
    row), or "a companion" (a live deployment's spec names it as its `companion:`)."""
    if deployment.replica_of_id is not None or Deployment.objects.filter(
            replica_of_id=deployment.pk).exclude(status__in=TERMINAL_STATUSES).exists():
        return "a replica"
    if Deployment.objects.filter(spec__companion=deployment.name).exclude(
            pk=deployment.pk).exclude(status__in=TERMINAL_STATUSES).exists():
        return "a companion"
    return ""


def deployment_restart_after_death(*, deployment_id: int, start_token: str,
                                   diagnosis: Diagnosis, message: str) -> bool:
    """The restart policy: an engine that died while serving starts again after a wait.

    Only from ready, and only the run whose engine died (its start token): a failure before
    ready needs a fix, not a retry. False when the spec has no policy or it is used up; the
    caller then marks the deployment failed. A replica or a companion
    (deployment_serves_a_set) exists to serve: it is started again whatever the policy,
    each time after the policy's doubling wait (capped at APPLIANCE_RESTART_BACKOFF_MAX_S),
    the same way after its host came back (its agent finds the engine exited) as after the
    engine died.
    """
    stored = catalogued(diagnosis).to_dict()
    row = Deployment.objects.get(pk=deployment_id)
    policy, _ = restart_from((row.spec or {}).get("restart"))
    serving = deployment_serves_a_set(deployment=row)
    if not serving and (not policy.on_failure or row.restarts >= policy.max_restarts):
        return False
    wait = backoff_s(row.restarts, first_s=float(settings.RESTART_BACKOFF_S),
                     max_s=float(settings.RESTART_BACKOFF_MAX_S))
    number, restarts = row.run + 1, row.restarts + 1
    why = (f"{serving} is brought back whatever the restart policy: start {restarts} after a "
           f"death, in {wait:.0f} s" if serving else
           f"restart {restarts} of {policy.max_restarts} in {wait:.0f} s (restart policy "
           "on-failure)")
    with transaction.atomic():
        event = _transition(
            row.pk, target=S.STARTING, by=Process.AGENT, match={"start_token": start_token},
            event={"run": number, "restarts": restarts, "diagnosis": stored},
            message=f"{message}; {why}, run {number}",
            phase="start", run=F("run") + 1, restarts=F("restarts") + 1,
            start_token=secrets.token_hex(8),
            restart_not_before=timezone.now() + timedelta(seconds=wait),
            **{**_FRESH_RUN, **_placed_agent(row.pk)})
        if event is None:
            return False
        _close_run(row, outcome="died", diagnosis=stored)
        _open_run(row, reason=Run.Reason.POLICY, user=None, event=event)
    return True
