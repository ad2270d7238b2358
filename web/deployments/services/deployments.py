"""The deployment actions a person takes (panel and API) on a deployment's own rows: stop,
restart (its next run queued) and delete; the hosts a placed deployment runs on; and the
recipes a spec may name. Deploying a spec (validate, place, pre-flight, create, redeploy,
scale), which reads the fleet and the model store, is web/deploy/services.py's.

Each action checks what the request may do and moves the status through lifecycle.py (the
one writer of `status`); work a worker or the engine agent does follows after commit.
Adding an action: docs/architecture.md, "Add a deployment action".
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from appliance.engine.recipes import (
    Recipe,
    list_recipes,
    load_site_recipe,
    site_recipes,
)
from appliance.lifecycle import Process
from web import tasks

from .. import live
from ..models import TERMINAL_STATUSES, Deployment
from . import gpus
from .errors import DeploymentInputError
from .lifecycle import (
    User,
    deployment_mark_requeued,
    deployment_mark_stopped,
    deployment_mark_stopping,
)
from .rolling import deployment_has_replicas, rolling_end, rolling_start
from .served_names import served_name_conflict


def recipe_names() -> list[str]:
    """Shipped recipes, then the site's own (APPLIANCE_RECIPES_DIR) under their file names."""
    return sorted(set(list_recipes()) | set(site_recipes(settings.RECIPES_DIR)))


def recipe_load(name: str) -> Recipe:
    """A recipe by name: the site's file of that name wins over a shipped one."""
    return load_site_recipe(name, settings.RECIPES_DIR)


def _group_ids(root_id: int) -> list[int]:
    """Replica 0 and its replica rows, by index."""
    rows = Deployment.objects.filter(replica_of_id=root_id).order_by("replica_index")
    return [root_id, *rows.values_list("pk", flat=True)]


def deployment_stop(*, deployment_id: int) -> Deployment:
    """A queued deployment stops at once; a running one goes to stopping, and the engine
    agent stops its engine at its next tick (a build under way sees it and is cancelled).
    Replica 0 stops with all its replicas (and ends a roll under way); a replica row stops
    alone."""
    row = Deployment.objects.only("pk", "replica_of").get(pk=deployment_id)
    if row.replica_of_id is None:
        rolling_end(deployment_id=deployment_id, why="Stop was pressed")
    ids = [deployment_id] if row.replica_of_id else _group_ids(deployment_id)
    for pk in ids:
        if not deployment_mark_stopped(deployment_id=pk, by=Process.WEB):
            deployment_mark_stopping(deployment_id=pk)
    return Deployment.objects.get(pk=deployment_id)


def not_terminal_error(deployment: Deployment, verb: str) -> DeploymentInputError:
    return DeploymentInputError(errors={"status": [
        f"Only a stopped or failed deployment can be {verb}; {deployment.name} is "
        f"{deployment.status}. Stop it first."]})


def deployment_restart(*, deployment_id: int, user: User = None) -> Deployment:
    """Start a stopped or failed deployment again: the same spec and row, a new run.

    Its GPUs are leased again in this transaction (a GPU another deployment took meanwhile
    is a 400 naming it, and nothing changes); the deploy task then builds or finds the image
    and the engine starts with a new start token, so no container of an earlier run is
    ever adopted. A restart keeps the row, its spec and its earlier events: each start of
    the engine is a run (models.Run) whose events are those from its first seq to the next
    run's.
    """
    row = Deployment.objects.get(pk=deployment_id)
    if deployment_has_replicas(deployment=row):  # one replica at a time (rolling.py)
        return rolling_start(deployment_id=row.pk, kind="restart", user=user)
    return deployment_requeue(deployment_id=deployment_id, user=user, verb="restarted")


def deployment_requeue(*, deployment_id: int, user: User, verb: str,
             changes: dict[str, Any] | None = None) -> Deployment:
    """A stopped or failed deployment's next run queued (with a redeploy's new columns)."""
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        if row.status not in TERMINAL_STATUSES:
            raise not_terminal_error(row, verb)
        spec = (changes or {}).get("spec", row.spec)
        taken = served_name_conflict(spec=spec, name=row.name, pk=row.pk)
        if taken:  # another deployment took its served name meanwhile
            raise DeploymentInputError(errors=taken)
        row.gpus = (changes or {}).get("gpus", row.gpus)
        # Replica 0 starts again with its ended replicas (those the spec still counts),
        # each on its own host and GPUs; a replica row starts alone.
        group = [row]
        if row.replica_of_id is None:
            group += list(Deployment.objects.select_for_update().filter(
                replica_of=row, replica_index__lt=int(spec.get("replicas") or 1),
                status__in=list(TERMINAL_STATUSES)).order_by("replica_index"))
        for member in group:
            gpus.acquire(deployment=member)  # raises (400, rolled back) if one is taken
            if not deployment_mark_requeued(deployment=member, user=user, why=verb,
                                            changes=changes if member is row else None):
                raise not_terminal_error(member, verb)
            tasks.deployment_start_later(member.pk)
        row.refresh_from_db()
    return row


def deployment_hosts(*, deployment_id: int, alone: bool = False) -> list[str]:
    """The hosts a placed deployment runs on, replica 0's first (a row from before
    placement: the panel's own); `alone`: only this row's."""
    rows = Deployment.objects.filter(pk=deployment_id) if alone else Deployment.objects.filter(
        Q(pk=deployment_id) | Q(replica_of_id=deployment_id))
    own = str(settings.HOST_NAME)
    return [host or own for host in rows.order_by("replica_index").values_list("host", flat=True)]


def deployment_delete(*, deployment_id: int) -> None:
    """Delete a stopped or failed deployment with its events, runs and metric series, and
    its replicas' (each stopped or failed too). A replica row goes only with replica 0."""
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        if row.replica_of_id is not None:
            raise DeploymentInputError(errors={"replica": [
                f"#{row.pk} is replica {row.replica_index} of deployment #{row.replica_of_id}: "
                f"it is deleted with that deployment (Delete on #{row.replica_of_id}), or "
                "stopped by scaling it down."]})
        ids = _group_ids(row.pk)
        rows = list(Deployment.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        for member in rows:
            if member.status not in TERMINAL_STATUSES:
                raise not_terminal_error(member, "deleted")
        Deployment.objects.filter(pk__in=ids, status__in=list(TERMINAL_STATUSES)).delete()
        for pk in ids:
            transaction.on_commit(lambda pk=pk: live.forget(pk))  # type: ignore[misc]


def deployment_set_progress(
    *,
    deployment_id: int,
    progress: dict[str, Any] | None = None,
    decode_stats: dict[str, Any] | None = None,
    log_cursor: str | None = None,
) -> None:
    fields: dict[str, Any] = {}
    if log_cursor is not None:
        fields["log_cursor"] = log_cursor
    if progress is not None:
        fields["progress"] = progress
    if decode_stats is not None:
        fields["decode_stats"] = decode_stats
    if fields:
        Deployment.objects.filter(pk=deployment_id).update(**fields)


