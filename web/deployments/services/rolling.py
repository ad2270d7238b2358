"""Rolling changes: Restart and Redeploy of a deployment with replicas, one replica at a time.

A roll is a small step machine whose whole state is replica 0's `rolling` field (the row
people see, so the page and the API read it with the row): its kind, its replicas in order,
the one whose turn it is (`at`) and that one's step. For each replica in turn:

    draining   out of the gateway's rotation (`draining`); wait until its in-flight requests
               are done (web/deployments/inflight.py's counter is 0, read no sooner than
               DRAIN_GRACE_S after the drain) or ROLL_DRAIN_TIMEOUT_S has passed
    stopping   the roller moves it to `stopping`; wait until the agent has stopped it
    starting   its next run is queued (a redeploy's new spec with it); wait for `ready`,
               then back into the rotation, and the next replica's turn (a run no worker
               took within ROLL_RESEND_S is sent to the workers once more)

A replica whose new run fails (or is stopped) halts the roll there, with its cause; the
replicas not reached keep serving their old run. Level-triggered: `rolling_tick` looks at
each roll under way and takes every step whose condition holds now; nothing is kept in a
process, so a restarted loop (or a second one: each step runs under replica 0's row lock)
goes on where the rows say. The panel loop (web/loop.py) calls it every tick (docs/fleet.md
says why there and not in a Celery task). The status moves are lifecycle.py's (by the roller).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from appliance.lifecycle import Process
from web import tasks
from web.deployments.inflight import replica_inflight

from ..models import TERMINAL_STATUSES, Deployment, DeploymentStatus, EventKind
from . import gpus
from .errors import DeploymentInputError
from .events import events_append
from .lifecycle import User, deployment_mark_requeued, deployment_mark_stopping
from .served_names import served_name_conflict

log = logging.getLogger(__name__)
S = DeploymentStatus
ROLLING, DONE, HALTED, ENDED = "rolling", "done", "halted", "ended"
DRAINING, STOPPING, STARTING = "draining", "stopping", "starting"
# The longest a panel process may route on a table read before this replica was drained
# (web/gateway/routing.py: a change reaches each process's watch at once, or its table is
# read again within a second or two while the watch is not known good): an in-flight count
# of 0 read sooner could miss a request about to start.
DRAIN_GRACE_S = 3.0
# The roller sends a replica's new run to the build worker after its transaction commits,
# from its own process (the panel loop's): a loop killed in between leaves the row queued
# with no message, which the general re-queue finds only after QUEUED_GRACE_S (10 minutes,
# web/builder/requeue.py). A run still queued and untaken this long after the roll queued it
# is sent once more (the deploy task ignores a second message: builds.deployment_run).
ROLL_RESEND_S = 20.0
_STEP_WORDS = {DRAINING: "draining (in-flight requests finishing)", STOPPING: "stopping",
               STARTING: "waiting for ready"}


def deployment_replicas(*, deployment: Deployment) -> list[Deployment]:
    """Replica 0 and its replica rows, by replica index."""
    rows = Deployment.objects.filter(replica_of=deployment).order_by("replica_index", "pk")
    return [deployment, *rows]


def deployment_has_replicas(*, deployment: Deployment) -> bool:
    return deployment.replica_of_id is None and deployment.replica_rows.exists()


def rolling_text(*, rolling: dict[str, Any]) -> str:
    """The roll in words, for the page and the API: "rolling restart: replica 2 of 3: ..."."""
    if not rolling:
        return ""
    kind, n, at = rolling["kind"], len(rolling["replicas"]), rolling["at"]
    state = rolling["state"]
    if state == ROLLING:
        words = _STEP_WORDS[rolling["step"]]
        if rolling["step"] == DRAINING and rolling.get("inflight"):
            words = f"draining ({rolling['inflight']} requests in flight)"
        return f"rolling {kind}: replica {at + 1} of {n}: {words}"
    if state == DONE:
        return f"rolling {kind} done: {n} of {n} replicas on their new run"
    if state == HALTED:
        return (f"rolling {kind} halted at replica {at + 1} of {n}: {rolling['why']}; "
                "the replicas not reached keep serving their earlier run")
    return f"rolling {kind} ended at replica {at + 1} of {n}: {rolling['why']}"


def rolling_start(*, deployment_id: int, kind: str, user: User = None,
                  columns: dict[str, Any] | None = None, rebuild_image: bool = False,
                  ) -> Deployment:
    """Begin a roll over every replica of the deployment (replica 0 the first).

    `columns` are a redeploy's new spec columns (spec, recipe, algorithm, preflight,
    load_estimate, graph_needed), written to each replica as its new run is queued;
    rebuild_image builds the image afresh for the first replica only (the others find it).
    Refused while another roll of it is under way.
    """
    now = timezone.now()
    with transaction.atomic():
        primary = Deployment.objects.select_for_update().get(pk=deployment_id)
        if (primary.rolling or {}).get("state") == ROLLING:
            raise DeploymentInputError(errors={"status": [
                f"{rolling_text(rolling=primary.rolling)}: wait for it to finish, or Stop "
                f"{primary.name} to end it."]})
        replicas = [r.pk for r in deployment_replicas(deployment=primary)]
        rolling: dict[str, Any] = {
            "kind": kind, "state": ROLLING, "at": 0, "step": DRAINING, "since": now.isoformat(),
            "replicas": replicas,
            "columns": columns, "rebuild_image": rebuild_image, "run": None, "inflight": None,
            "by": getattr(user, "username", "") or "the API", "started_at": now.isoformat(),
            "ended_at": None, "why": "", "drain_timeout_s": settings.ROLL_DRAIN_TIMEOUT_S,
        }
        _save(primary.pk, rolling, f"rolling {kind} of {len(replicas)} replicas "
              f"begun by {rolling['by']}")
    primary.refresh_from_db()
    return primary


def rolling_end(*, deployment_id: int, why: str) -> bool:
    """End a roll under way where it is (Stop on the deployment); False when none was."""
    with transaction.atomic():
        primary = Deployment.objects.select_for_update().get(pk=deployment_id)
        rolling = dict(primary.rolling or {})
        if rolling.get("state") != ROLLING:
            return False
        # The replica whose turn it was serves again if it still can (drained, it would not).
        Deployment.objects.filter(pk=rolling["replicas"][rolling["at"]]).update(draining=False)
        _finish(rolling, ENDED, why)
        _save(primary.pk, rolling, rolling_text(rolling=rolling))
    return True


def rolling_tick(*, client: Any) -> int:
    """Take the next steps of every roll under way (the panel loop calls it each tick);
    how many rolls moved. Each call leaves the roller's beat in Redis (rolling_shown)."""
    pks = list(Deployment.objects.filter(replica_of__isnull=True, rolling__state=ROLLING)
               .values_list("pk", flat=True))
    moved = 0
    for pk in pks:
        try:
            moved += rolling_step(deployment_id=pk, client=client)
        except Exception:  # noqa: BLE001 - one roll's error holds up no other; next tick again
            log.exception("deployment %s: a rolling change's step failed; retried", pk)
    # Best effort: without it a page says the roll may wait for a loop, which it checks.
    with contextlib.suppress(redis.RedisError):
        client.set(roller_beat_key(), "1", ex=ROLLER_SILENT_S)
    return moved


# How long without a rolling_tick before a roll under way is shown as waiting for it.
ROLLER_SILENT_S = 30


def roller_beat_key() -> str:
    """One install's beat: its database's name tells installs sharing a Redis apart."""
    return f"appliance:roller:beat:{connection.settings_dict['NAME']}"


@cache
def _beat_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=settings.REDIS_SOCKET_TIMEOUT_S,
                                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT_S)


def rolling_shown(*, rolling: dict[str, Any]) -> dict[str, Any]:
    """The roll as the page shows it: while one is under way and no roller has ticked for
    ROLLER_SILENT_S (no panel loop runs: its steps wait), its text says so and what to do.
    Redis unreadable: shown as stored."""
    if (rolling or {}).get("state") != ROLLING:
        return rolling or {}
    try:
        beating = bool(_beat_client(settings.REDIS_URL).exists(roller_beat_key()))
    except redis.RedisError:
        return rolling
    if beating:
        return rolling
    return {**rolling, "waiting_for_loop": True, "text": (
        f"{rolling.get('text') or rolling_text(rolling=rolling)}; waiting: no panel loop has "
        f"taken a step for {ROLLER_SILENT_S} s or more, so this roll waits for one (start "
        "the compose service `loop`, python3 -m worker.loop)")}


def rolling_step(*, deployment_id: int, client: Any) -> bool:
    """Every step of this roll whose condition holds now, in one transaction under replica
    0's row lock (a second loop waits, then sees the steps taken); True if it moved."""
    with transaction.atomic():
        primary = Deployment.objects.select_for_update().get(pk=deployment_id)
        rolling = dict(primary.rolling or {})
        moved = False
        while rolling.get("state") == ROLLING and (note := _advance(rolling, client)):
            _save(primary.pk, rolling, note)
            moved = True
        if not moved and rolling != primary.rolling:  # the in-flight count the page shows
            Deployment.objects.filter(pk=primary.pk).update(
                rolling={**rolling, "text": rolling_text(rolling=rolling)})
        return moved


def _advance(rolling: dict[str, Any], client: Any) -> str:
    """One step of the replica whose turn it is, if its condition holds: what happened, in
    words, or "" (nothing yet)."""
    row = Deployment.objects.select_for_update().filter(pk=rolling["replicas"][rolling["at"]]
                                                        ).first()
    if row is None:  # deleted under the roll (a replica scaled away): the next one's turn
        return _next(rolling, "gone")
    if rolling["step"] == DRAINING:
        return _drain(rolling, row, client)
    if rolling["step"] == STOPPING:
        return _start(rolling, row) if row.status in TERMINAL_STATUSES else ""
    return _started(rolling, row)


def _drain(rolling: dict[str, Any], row: Deployment, client: Any) -> str:
    if not row.draining:
        Deployment.objects.filter(pk=row.pk).update(draining=True)
        rolling["since"] = timezone.now().isoformat()  # the grace and the timeout run from here
        return f"{_who(rolling)}: drained, out of the gateway's rotation"
    if row.status == S.READY and not _drained(rolling, row, client):
        return ""
    rolling.update(step=STOPPING, since=timezone.now().isoformat())
    if row.status in TERMINAL_STATUSES:
        return f"{_who(rolling)}: not running ({row.status})"
    deployment_mark_stopping(deployment_id=row.pk, by=Process.ROLLER,
                             message=f"rolling {rolling['kind']}: stopping for its new run")
    return f"{_who(rolling)}: stopping"


def _drained(rolling: dict[str, Any], row: Deployment, client: Any) -> bool:
    """Its in-flight requests are done, or the drain has waited its timeout out."""
    waited = (timezone.now() - datetime.fromisoformat(rolling["since"])).total_seconds()
    if waited >= float(rolling["drain_timeout_s"]):
        return True
    try:
        rolling["inflight"] = replica_inflight(client=client, deployment_id=row.pk)
    except redis.RedisError:
        rolling["inflight"] = None  # unknown: only the timeout ends the wait
        return False
    return waited >= DRAIN_GRACE_S and rolling["inflight"] == 0


def _start(rolling: dict[str, Any], row: Deployment) -> str:
    """Queue the replica's next run (a redeploy's spec with it); a refusal halts the roll."""
    changes = _changes(rolling, row)
    rolling.update(step=STARTING, since=timezone.now().isoformat(), run=row.run, resent=None)
    try:
        with transaction.atomic():  # a refusal rolls back what it took (a savepoint)
            taken = served_name_conflict(spec=changes.get("spec", row.spec), name=row.name,
                                         family=rolling["replicas"][0])
            if taken:
                raise DeploymentInputError(errors=taken)
            gpus.acquire(deployment=row)
            deployment_mark_requeued(deployment=row, by=Process.ROLLER, changes=changes,
                                     why=f"rolling {rolling['kind']}")
    except DeploymentInputError as exc:
        cause = "; ".join(t for texts in exc.errors.values() for t in texts)
        return _halt(rolling, row, f"its new run could not be queued: {cause}")
    tasks.deployment_start_later(row.pk)
    return f"{_who(rolling)}: run {row.run + 1} queued"


def _changes(rolling: dict[str, Any], row: Deployment) -> dict[str, Any]:
    columns = dict(rolling.get("columns") or {})
    if "spec" in columns:  # each replica keeps its own GPUs
        columns["spec"] = {**columns["spec"], "gpus": list(row.gpus)}
    if rolling.get("rebuild_image") and rolling["at"] == 0:
        columns["rebuild_image"] = True
    return columns


def _started(rolling: dict[str, Any], row: Deployment) -> str:
    if row.run <= (rolling.get("run") or 0):
        return ""  # not its new run yet (the move above had not committed)
    if row.status == S.READY:
        Deployment.objects.filter(pk=row.pk).update(draining=False)
        return _next(rolling, f"ready on run {row.run}, back in the gateway's rotation")
    if row.status in TERMINAL_STATUSES:
        summary = (row.diagnosis or {}).get("summary") or f"it was {row.status}"
        return _halt(rolling, row, f"its new run {row.run} did not become ready: {summary}")
    if _forgotten(rolling, row):
        rolling["resent"] = timezone.now().isoformat()
        tasks.deployment_start_later(row.pk)
        return (f"{_who(rolling)}: run {row.run} still queued after {ROLL_RESEND_S:.0f} s, "
                "taken by no worker; sent to the workers again")
    return ""


def _forgotten(rolling: dict[str, Any], row: Deployment) -> bool:
    """Its new run queued, no worker on it, long enough to say its message was lost."""
    if row.status != S.QUEUED or row.build_owner or rolling.get("resent"):
        return False
    waited = (timezone.now() - datetime.fromisoformat(rolling["since"])).total_seconds()
    return waited >= ROLL_RESEND_S


def _next(rolling: dict[str, Any], what: str) -> str:
    note = f"{_who(rolling)}: {what}"
    if rolling["at"] + 1 >= len(rolling["replicas"]):
        _finish(rolling, DONE, "")
        return f"{note}; {rolling_text(rolling=rolling)}"
    rolling.update(at=rolling["at"] + 1, step=DRAINING, since=timezone.now().isoformat(),
                   run=None, inflight=None)
    return note


def _halt(rolling: dict[str, Any], row: Deployment, cause: str) -> str:
    # Out of the rotation by its status already; undrained, a Restart of it later serves.
    Deployment.objects.filter(pk=row.pk).update(draining=False)
    _finish(rolling, HALTED, cause)
    return rolling_text(rolling=rolling)


def _finish(rolling: dict[str, Any], state: str, cause: str) -> None:
    rolling.update(state=state, why=cause, ended_at=timezone.now().isoformat(),
                   inflight=None)


def _who(rolling: dict[str, Any]) -> str:
    return (f"rolling {rolling['kind']}, replica {rolling['at'] + 1} of "
            f"{len(rolling['replicas'])}")


def _save(pk: int, rolling: dict[str, Any], note: str) -> None:
    """The roll's state on replica 0, and the step in its event log (the record)."""
    rolling["text"] = rolling_text(rolling=rolling)  # as the API and the page show it
    Deployment.objects.filter(pk=pk).update(rolling=rolling)
    events_append(deployment_id=pk, events=[(EventKind.STATUS, {
        "message": note,
        "rolling": {k: rolling[k] for k in ("kind", "state", "at", "step", "text")}})])
