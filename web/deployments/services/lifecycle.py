"""A deployment's life beyond Stop: Restart, Delete, and the restart policy's restarts.

Each is a conditional UPDATE (or DELETE) on the statuses it starts from, under the row's
lock; zero rows means another request won, and the caller is told so. A restart keeps the
row, its spec and its earlier events: each start of the engine is a run (models.Run) whose
events are those from its first seq to the next run's.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from appliance.engine.restart import backoff_s, restart_from

from .. import live
from ..models import TERMINAL_STATUSES, Deployment, DeploymentStatus, EventKind, Run
from .deployments import DeploymentInputError
from .events import events_append
from .leases import gpu_leases_acquire
from .served_names import served_name_conflict

S = DeploymentStatus
User = AbstractBaseUser | AnonymousUser | None

# What a new run starts without: the last run's engine, figures and verdict.
_FRESH_RUN: dict[str, Any] = {
    "progress": {}, "decode_stats": {}, "alerts": {}, "engine_url": "", "log_cursor": "",
    "ready_at": None, "agent_id": "", "lease_until": None,
}


def _not_terminal(deployment: Deployment, verb: str) -> DeploymentInputError:
    return DeploymentInputError(errors={"status": [
        f"Only a stopped or failed deployment can be {verb}; {deployment.name} is "
        f"{deployment.status}. Stop it first."]})


def _who(user: User) -> Any:
    return user if user is not None and user.is_authenticated else None


def _close_run(deployment: Deployment, *, outcome: str, diagnosis: Any) -> None:
    """Record how the current run ended; run 1 is written now if it never was."""
    Run.objects.get_or_create(deployment=deployment, number=1, defaults={
        "reason": Run.Reason.DEPLOY, "first_seq": 1, "started_at": deployment.created_at,
        "started_by": deployment.created_by})
    Run.objects.filter(deployment=deployment, number=deployment.run).update(
        outcome=outcome, diagnosis=diagnosis)


def _open_run(deployment: Deployment, *, reason: str, message: str, user: User,
              **payload: Any) -> None:
    """The new run's first event (its phase line in the log) and its row."""
    event = events_append(deployment_id=deployment.pk, events=[(EventKind.PHASE, {
        "status": deployment.status, "message": message, "run": deployment.run, **payload})])
    Run.objects.create(deployment=deployment, number=deployment.run, reason=reason,
                       first_seq=event[0].seq, started_at=timezone.now(),
                       started_by=_who(user))


def deployment_restart(*, deployment_id: int, user: User = None) -> Deployment:
    """Start a stopped or failed deployment again: the same spec and row, a new run.

    Its GPUs are leased again in this transaction (a GPU another deployment took meanwhile
    is a 400 naming it, and nothing changes); the deploy task then builds or finds the image
    and the engine starts with a new start token, so no container of an earlier run is
    ever adopted.
    """
    now = timezone.now()
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        if row.status not in TERMINAL_STATUSES:
            raise _not_terminal(row, "restarted")
        taken = served_name_conflict(spec=row.spec, name=row.name, pk=row.pk)
        if taken:  # another deployment took its served name meanwhile
            raise DeploymentInputError(errors=taken)
        _close_run(row, outcome=row.status, diagnosis=row.diagnosis)
        updated = Deployment.objects.filter(pk=row.pk, status__in=list(TERMINAL_STATUSES)).update(
            status=S.QUEUED, phase="", run=F("run") + 1, restarts=0, restart_not_before=None,
            start_token="", diagnosis=None, last_lines=[], ended_at=None, rebuild_image=False,
            build_owner="", build_lease_until=None, status_times={S.QUEUED: now.isoformat()},
            updated_at=now, **_FRESH_RUN)
        if not updated:
            raise _not_terminal(row, "restarted")
        row.refresh_from_db()
        gpu_leases_acquire(deployment=row)  # raises (400, rolled back) when a GPU is taken
        who = getattr(user, "username", "") or "the API"
        _open_run(row, reason=Run.Reason.RESTART, user=user,
                  message=f"run {row.run} queued: restarted by {who}")
        transaction.on_commit(lambda: _enqueue_deploy(row.pk))
    return row


def _enqueue_deploy(deployment_id: int) -> None:
    from worker.celery import app

    app.send_task("worker.tasks.deploy", args=[deployment_id])


def deployment_delete(*, deployment_id: int) -> None:
    """Delete a stopped or failed deployment with its events, runs and metric series."""
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        if row.status not in TERMINAL_STATUSES:
            raise _not_terminal(row, "deleted")
        Deployment.objects.filter(pk=row.pk, status__in=list(TERMINAL_STATUSES)).delete()
        transaction.on_commit(lambda: live.forget(deployment_id))


def deployment_restart_after_death(*, deployment_id: int, start_token: str,
                                   diagnosis: dict[str, Any], message: str) -> bool:
    """The restart policy: an engine that died while serving starts again after a wait.

    Only from ready, and only the run whose engine died (its start token): a failure before
    ready needs a fix, not a retry. False when the spec has no policy or it is used up; the
    caller then marks the deployment failed.
    """
    row = Deployment.objects.get(pk=deployment_id)
    policy, _ = restart_from((row.spec or {}).get("restart"))
    if not policy.on_failure or row.restarts >= policy.max_restarts:
        return False
    wait = backoff_s(row.restarts, first_s=float(settings.RESTART_BACKOFF_S),
                     max_s=float(settings.RESTART_BACKOFF_MAX_S))
    now = timezone.now()
    with transaction.atomic():
        updated = Deployment.objects.filter(
            pk=row.pk, status=S.READY, start_token=start_token).update(
            status=S.STARTING, phase="start", run=F("run") + 1, restarts=F("restarts") + 1,
            start_token=secrets.token_hex(8), restart_not_before=now + timedelta(seconds=wait),
            status_times={**(row.status_times or {}), S.STARTING: now.isoformat()},
            updated_at=now, **_FRESH_RUN)
        if not updated:
            return False
        _close_run(row, outcome="died", diagnosis=diagnosis)
        row.refresh_from_db()
        _open_run(row, reason=Run.Reason.POLICY, user=None, restarts=row.restarts,
                  diagnosis=diagnosis,
                  message=f"{message}; restart {row.restarts} of {policy.max_restarts} "
                          f"in {wait:.0f} s (restart policy on-failure), run {row.run}")
    return True
