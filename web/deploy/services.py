"""Deploying a spec, which spans web's apps: validate it under its recipe, place its replicas
on the fleet (web/fleet/placement.py), run pre-flight against the model store's entries
(web/store/loadtime.py) and the chosen hosts' facts, and make, lease and queue its rows;
redeploy, run one row alone on a new spec, and scale. Each action checks what the request may
do and moves the status through web/deployments/services/lifecycle.py (the one writer of
`status`); work a worker or the engine agent does follows after commit. The actions that
need only a deployment's own rows (stop, restart, delete) are
web/deployments/services/deployments.py's.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Q

from appliance.engine.spec import (
    MAX_REPLICAS,
    DeploymentSpec,
    spec_from_dict,
    spec_to_dict,
)
from appliance.engine.widths import needed_graph_widths
from appliance.lifecycle import Process
from appliance.preflight import Finding
from web import tasks
from web.deploy.checks import deployment_validate, on_hosts, placed, recipe_for, spec_checked
from web.deployments.models import TERMINAL_STATUSES, Deployment, DeploymentStatus, EventKind
from web.deployments.services.deployments import (
    deployment_hosts,
    deployment_requeue,
    not_terminal_error,
)
from web.deployments.services.errors import DeploymentInputError
from web.deployments.services.events import events_append
from web.deployments.services.lifecycle import (
    User,
    deployment_mark_requeued,
    deployment_mark_stopped,
    deployment_mark_stopping,
)
from web.deployments.services.rolling import deployment_has_replicas, rolling_start
from web.deployments.services.served_names import served_name_conflict
from web.fleet.leases import gpu_leases_acquire
from web.fleet.placement import Choice, placement_store
from web.store.loadtime import (
    load_estimate,
    root_read_rate_request,
    unmeasured_roots,
)

S = DeploymentStatus


def deployment_create(
    *,
    data: dict[str, Any],
    user: AbstractBaseUser | AnonymousUser | None = None,
    confirm_warnings: bool = False,
    rebuild_image: bool = False,
) -> Deployment:
    """Validate, place, pre-flight on the chosen hosts, store, and queue the deploy task
    once the row is committed.

    rebuild_image builds the engine image without the cache even when its tag exists
    (a moved base image tag, a suspect earlier build).
    """
    checked = spec_checked(data)
    spec, findings = checked.spec, checked.findings
    warnings = [f for f in findings if f.severity == "warning"]
    if warnings and not confirm_warnings and not checked.refused:
        raise DeploymentInputError(
            errors={"confirm_warnings": ["Pre-flight has warnings; confirm to deploy anyway."]},
            findings=findings,
            needs_confirmation=True,
            host=checked.host,
        )
    with transaction.atomic():
        # Another active deployment of this served name is a 400 naming it; nothing stored.
        taken = served_name_conflict(spec=spec_to_dict(spec), name=spec.name)
        if checked.refused:
            raise DeploymentInputError(errors={**taken, **checked.refused})
        # Replica 0 and the spec's other replicas, each where placement chose (its host's
        # pre-flight on its row), leased and queued here: a GPU or a name refused rolls
        # them all back (400), all said at once (a Clone as it is takes both its GPUs and
        # its name).
        try:
            first: Deployment | None = None
            for choice in checked.choices:
                row = _row_create(spec, [f.to_dict() for f in checked.each[choice.host]],
                                  choice, first=first, user=user,
                                  rebuild_image=rebuild_image)
                first = first or row
        except DeploymentInputError as exc:
            raise DeploymentInputError(errors={**taken, **exc.errors}) from None
        if taken:
            raise DeploymentInputError(errors=taken)
        for root in unmeasured_roots(spec):  # the Weights card compares the load with it
            root_read_rate_request(root=root)
    assert first is not None
    return first


def _row_create(spec: DeploymentSpec, preflight: list[dict[str, Any]], choice: Choice, *,
                first: Deployment | None, user: User, rebuild_image: bool) -> Deployment:
    """One replica row of the spec where its placement says, its GPUs leased (a GPU held
    by another deployment raises), its first events, its deploy task after commit."""
    deployment = Deployment.objects.create(
        name=spec.name,
        spec=spec_to_dict(spec),
        recipe=spec.recipe,
        algorithm=spec.engine.speculative_algorithm,
        gpus=list(choice.gpus),
        preflight=preflight,
        load_estimate=load_estimate(spec),
        graph_needed=needed_graph_widths(spec.engine) or {},
        rebuild_image=rebuild_image,
        created_by=user if user is not None and user.is_authenticated else None,  # type: ignore[misc]
        replica_of=first,
        replica_index=choice.replica,
    )
    placement_store(deployment=deployment, choice=choice)
    gpu_leases_acquire(deployment=deployment)
    queued = {"status": S.QUEUED, "message": "deployment queued", "placement": choice.reason}
    if first is not None:
        queued["message"] = f"replica {choice.replica} of #{first.pk} queued"
    events_append(
        deployment_id=deployment.pk,
        events=[("status", queued),
                ("preflight", {"findings": preflight})],
    )
    tasks.deployment_start_later(deployment.pk)
    return deployment


# What a redeploy may not change: the replicas' count and GPUs are Scale's, where they run is
# placement's, and the name is what clients call (the gateway routes old and new runs by it).
# Each key: its words, and its value when a spec leaves it out.
_REDEPLOY_KEEPS: dict[str, tuple[str, Any]] = {
    "name": ("the name", None), "replicas": ("the replica count (use Scale)", 1),
    "host": ("the host (placement)", None)}


def deployment_redeploy(*, deployment_id: int, data: dict[str, Any], user: User = None,
                        confirm_warnings: bool = False, rebuild_image: bool = False,
                        ) -> Deployment:
    """Run a deployment on a new spec (or a new image: rebuild_image), in place.

    With replicas: a rolling redeploy, one replica at a time (rolling.py), the others
    serving meanwhile. With one replica: as Restart, a stopped or failed deployment's next
    run, now of the new spec; a running one is refused (nothing would serve while it
    starts again: Stop it first, or give it replicas).
    """
    row = Deployment.objects.get(pk=deployment_id)
    hosts = deployment_hosts(deployment_id=row.pk)  # a redeploy keeps where it runs
    spec, findings = deployment_validate(data=data, hosts=hosts)
    if [f for f in findings if f.severity == "warning"] and not confirm_warnings:
        raise DeploymentInputError(
            errors={"confirm_warnings": ["Pre-flight has warnings; confirm to deploy anyway."]},
            findings=findings, needs_confirmation=True, host=", ".join(dict.fromkeys(hosts)))
    columns = _spec_columns(spec, findings)
    changed = [what for key, (what, default) in _REDEPLOY_KEEPS.items()
               if columns["spec"].get(key, default) != (row.spec or {}).get(key, default)]
    if changed:
        raise DeploymentInputError(errors={"spec": [
            f"A redeploy keeps {', '.join(changed)}; deploy a new deployment for that."]})
    if deployment_has_replicas(deployment=row):
        if columns["spec"].get("gpus") != list(row.gpus):
            raise DeploymentInputError(errors={"gpus": [
                "A rolling redeploy keeps each replica's GPUs; leave gpus as they are."]})
        return rolling_start(deployment_id=row.pk, kind="redeploy", user=user,
                             columns=columns, rebuild_image=rebuild_image)
    return deployment_requeue(deployment_id=row.pk, user=user, verb="redeployed",
                    changes={**columns, "gpus": list(spec.gpus), "rebuild_image": rebuild_image})


def deployment_run_alone(*, deployment_id: int, data: dict[str, Any], user: User = None,
                         why: str) -> Deployment:
    """One stopped or failed row of a deployment with replicas started again alone on a new
    spec, its own GPUs kept, the other replicas untouched (they keep serving): a Tune runs
    its candidates on replica 0 so. A row still running is refused (400)."""
    hosts = deployment_hosts(deployment_id=deployment_id, alone=True)
    spec, findings = deployment_validate(data=data, hosts=hosts)
    columns = _spec_columns(spec, findings)
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        if row.status not in TERMINAL_STATUSES:
            raise not_terminal_error(row, "started alone")
        columns["spec"] = {**columns["spec"], "gpus": list(row.gpus)}
        taken = served_name_conflict(spec=columns["spec"], name=row.name,
                                     family=row.replica_of_id or row.pk)
        if taken:
            raise DeploymentInputError(errors=taken)
        gpu_leases_acquire(deployment=row)
        if not deployment_mark_requeued(deployment=row, user=user, why=why, changes=columns):
            raise not_terminal_error(row, "started alone")
        tasks.deployment_start_later(row.pk)
    row.refresh_from_db()
    return row


def _spec_columns(spec: DeploymentSpec, findings: list[Finding]) -> dict[str, Any]:
    """The row's columns that follow from a validated spec (as deployment_create stores)."""
    return {"spec": spec_to_dict(spec), "recipe": spec.recipe,
            "algorithm": spec.engine.speculative_algorithm,
            "preflight": [f.to_dict() for f in findings], "load_estimate": load_estimate(spec),
            "graph_needed": needed_graph_widths(spec.engine) or {}}


def deployment_scale(*, deployment_id: int, replicas: int, user: User = None) -> Deployment:
    """Run `replicas` engines of the deployment's spec: start the missing rows (new ones,
    or ended ones again, each placed anew: spread over hosts, then other GPUs), stop the
    highest-index rows beyond. All placed and leased in one transaction, or nothing (400
    naming what each host lacks). Replica 0 must be running; the spec keeps the count."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not (
            1 <= replicas <= MAX_REPLICAS):
        raise DeploymentInputError(errors={"replicas": [
            f"replicas is a whole number from 1 to {MAX_REPLICAS}, not {str(replicas)[:20]!r}."]})
    with transaction.atomic():
        root = Deployment.objects.select_for_update().get(pk=deployment_id)
        if root.replica_of_id is not None:
            raise DeploymentInputError(errors={"replicas": [
                f"#{root.pk} is replica {root.replica_index} of deployment "
                f"#{root.replica_of_id}: scale #{root.replica_of_id}."]})
        if root.status in TERMINAL_STATUSES:
            raise DeploymentInputError(errors={"status": [
                f"{root.name} is {root.status}: only a running deployment scales. Restart it "
                "first (its replicas start with it)."]})
        rows = {r.replica_index: r for r in
                Deployment.objects.select_for_update().filter(replica_of=root)}
        rows[0] = root
        running = {i for i, r in rows.items() if r.status not in TERMINAL_STATUSES}
        wanted = [i for i in range(replicas) if i not in running]
        spec = spec_from_dict(root.spec)
        choices = placed(spec, replicas=wanted,
                          used=[rows[i].host for i in sorted(running) if i < replicas])
        # Each host a replica goes to is pre-flighted as a new deployment's would be.
        each = on_hosts(spec, recipe_for(root.spec), root.spec,
                         [c.host for c in choices])[1] if choices else {}
        for choice in choices:
            ended = rows.get(choice.replica)
            if ended is None:
                _row_create(spec, [f.to_dict() for f in each[choice.host]], choice, first=root,
                            user=user, rebuild_image=False)
                continue
            placement_store(deployment=ended, choice=choice)
            gpu_leases_acquire(deployment=ended)
            if not deployment_mark_requeued(deployment=ended, user=user):
                raise not_terminal_error(ended, "started again")
            tasks.deployment_start_later(ended.pk)
        for i in sorted((i for i in running if i >= replicas), reverse=True):
            if not deployment_mark_stopped(deployment_id=rows[i].pk, by=Process.WEB):
                deployment_mark_stopping(deployment_id=rows[i].pk)
        Deployment.objects.filter(Q(pk=root.pk) | Q(replica_of=root)).update(
            spec={**root.spec, "replicas": replicas})
        was = len(running)
        events_append(deployment_id=root.pk, events=[(EventKind.STATUS, {
            "message": f"scaled from {was} to {replicas} replicas by "
                       f"{getattr(user, 'username', '') or 'the API'}"})])
        root.refresh_from_db()
    return root
