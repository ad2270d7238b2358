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

import dataclasses
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Q

from appliance.engine.envkeys import env_key_errors
from appliance.engine.extra_args import absorb, original_field
from appliance.engine.recipes import Recipe, RecipeError
from appliance.engine.spec import (
    MAX_REPLICAS,
    DeploymentSpec,
    SpecError,
    engine_base_types,
    spec_from_dict,
    spec_to_dict,
)
from appliance.engine.widths import needed_graph_widths
from appliance.lifecycle import Process
from appliance.preflight import Finding, has_errors, run_preflight
from web import tasks
from web.deployments.models import TERMINAL_STATUSES, Deployment, DeploymentStatus, EventKind
from web.deployments.services.deployments import (
    deployment_hosts,
    deployment_requeue,
    not_terminal_error,
    recipe_load,
    recipe_names,
)
from web.deployments.services.errors import DeploymentInputError
from web.deployments.services.events import events_append
from web.deployments.services.hosts import (
    host_driver_findings,
    host_gpu_findings,
    host_gpu_inventory_findings,
)
from web.deployments.services.lifecycle import (
    User,
    deployment_mark_requeued,
    deployment_mark_stopped,
    deployment_mark_stopping,
)
from web.deployments.services.modelfiles import local_model_facts
from web.deployments.services.rolling import deployment_has_replicas, rolling_start
from web.deployments.services.served_names import served_name_conflict
from web.fleet.hostfacts import host_facts
from web.fleet.leases import gpu_leases_acquire
from web.fleet.placement import Choice, PlacementRefused, deployment_place, placement_store
from web.store.loadtime import (
    deployment_entries_resolve,
    load_estimate,
    root_read_rate_request,
    store_facts,
    unmeasured_roots,
)

S = DeploymentStatus


def _spec_errors(exc: SpecError) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for item in exc.errors:
        text = f"{item.message} {item.fix}".strip() if item.fix else item.message
        errors.setdefault(item.field or "non_field_errors", []).append(text)
    return errors


def _recipe_for(data: dict[str, Any]) -> Recipe | None:
    """The named recipe, or None when the spec names none (the spec check then says so).

    Recipe files by path are for the command line; over the network only shipped
    recipe names are accepted, so no request can make the server read a file.
    """
    name = data.get("recipe") if isinstance(data, dict) else None
    if not isinstance(name, str):
        return None
    if name not in recipe_names():
        choices = ", ".join(recipe_names())
        raise DeploymentInputError(
            errors={"recipe": [f"Unknown recipe {name!r}. Use one of: {choices}."]}
        )
    try:
        return recipe_load(name)
    except RecipeError as exc:
        raise DeploymentInputError(errors={"recipe": [str(exc)]}) from None


def _as_written(findings: list[Finding], data: dict[str, Any]) -> list[Finding]:
    """Findings about extra_args items name them as the person wrote them: option flags
    were taken out of the list (appliance.engine.extra_args) before the rules ran."""
    raw = data.get("extra_args") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        return findings
    rest_at = absorb(raw, engine_base_types(), ()).rest_at
    return [dataclasses.replace(f, field=original_field(f.field, rest_at)) for f in findings]


def _parsed(data: dict[str, Any]) -> tuple[dict[str, Any], DeploymentSpec, Recipe | None]:
    """The spec under its recipe's engine defaults, or DeploymentInputError naming each bad
    field."""
    data, entry_errors = deployment_entries_resolve(data=data)  # models named by store entry
    if entry_errors:
        raise DeploymentInputError(errors=entry_errors)
    recipe = _recipe_for(data)
    try:
        spec = spec_from_dict(data, engine_defaults=recipe.engine_defaults if recipe else None)
        refused = env_key_errors(spec.env, declared=recipe.env_allow if recipe else (),
                                 test_engine=settings.ENGINE_TEST_ENV)
        if refused:
            raise SpecError(refused)
    except SpecError as exc:
        raise DeploymentInputError(errors=_spec_errors(exc)) from None
    return data, spec, recipe


def _model_facts(spec: DeploymentSpec) -> dict[str, Any]:
    """The model store's facts for pre-flight; the same whichever host is checked."""
    # Only files under the model roots are read here (modelfiles.py), never a path as given.
    return store_facts(spec, local_model_facts(spec))


def _rules(spec: DeploymentSpec, recipe: Recipe | None, data: dict[str, Any],
           host: str | None, models: dict[str, Any] | None = None) -> list[Finding]:
    """The pre-flight rules against one host's facts (its GPUs, Docker, secret store);
    with no host, the rules that need none (the others stay quiet)."""
    facts = host_facts(name=host) if host is not None else None
    findings = run_preflight(spec, recipe=recipe, read_local_configs=False,
                             host_gpus=facts.gpus if facts else None,
                             **(models if models is not None else _model_facts(spec)),
                             secret_names=facts.secret_names if facts else None)
    if facts is not None:
        findings += host_gpu_findings(gpus=list(spec.gpus), host=facts)
        findings += host_gpu_inventory_findings(gpus=list(spec.gpus), host=facts)
        findings += host_driver_findings(gpus=list(spec.gpus), host=facts,
                                         base_image=recipe.base_image if recipe else None)
    return _as_written(findings, data)


def _error_texts(findings: list[Finding]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for finding in findings:
        if finding.severity == "error":
            errors.setdefault(finding.field or "non_field_errors", []).append(
                f"{finding.message} Fix: {finding.fix} [{finding.rule}]")
    return errors


def _on_hosts(spec: DeploymentSpec, recipe: Recipe | None, data: dict[str, Any],
              hosts: Sequence[str]) -> tuple[list[Finding], dict[str, list[Finding]]]:
    """Pre-flight on each host the spec's replicas run on, the first host's findings first:
    (the findings answered, each host's own). What another host adds (a secret its store
    lacks, its GPUs' architecture) says which host; an error on any host refuses."""
    models = _model_facts(spec)  # read once: the model folders are the panel's
    each = {host: _rules(spec, recipe, data, host, models) for host in dict.fromkeys(hosts)}
    first = each[hosts[0]]
    findings = list(first) + [
        dataclasses.replace(f, message=f"On host {host}: {f.message}")
        for host, found in list(each.items())[1:] for f in found if f not in first]
    if has_errors(findings):
        raise DeploymentInputError(errors=_error_texts(findings), findings=findings,
                                   host=", ".join(each))
    return findings, each


def deployment_validate(*, data: dict[str, Any], hosts: Sequence[str] | None = None
                        ) -> tuple[DeploymentSpec, list[Finding]]:
    """Validate a spec under its recipe's engine defaults and run pre-flight against the
    hosts it runs on: those named (a placed deployment's rows' hosts), else the hosts
    placement chooses for it now (deployment_check).

    Raises DeploymentInputError naming each bad field, the placement's refusal, or the
    pre-flight errors.
    """
    if hosts is None:
        checked = deployment_check(data=data)
        return checked.spec, checked.findings
    data, spec, recipe = _parsed(data)
    findings, _ = _on_hosts(spec, recipe, data, list(hosts) or [str(settings.HOST_NAME)])
    return spec, findings


@dataclasses.dataclass(frozen=True)
class Checked:
    """A spec placed (a read: nothing is stored) and pre-flighted on the hosts chosen."""

    spec: DeploymentSpec
    findings: list[Finding]  # replica 0's host's, then what the other hosts add
    choices: list[Choice]  # where each replica goes; empty when placement refused
    each: dict[str, list[Finding]]  # host -> its own findings (each row keeps its host's)
    refused: dict[str, list[str]]  # placement's refusal (field -> what each host lacks)

    @property
    def host(self) -> str:
        """The host pre-flight checked (replica 0's first, then the other replicas')."""
        return ", ".join(self.each)


def _checked(data: dict[str, Any]) -> Checked:
    """Place the spec's replicas, then run pre-flight against the chosen hosts' facts.

    Where placement refuses, the rules that need no host still run: their errors come with
    the refusal (raised); alone, the refusal is left to the caller (Checked.refused)."""
    data, spec, recipe = _parsed(data)
    try:
        choices = _placed(spec, replicas=range(spec.replicas))
    except DeploymentInputError as refusal:
        findings = _rules(spec, recipe, data, None)
        if has_errors(findings):
            errors = dict(refusal.errors)
            for field, texts in _error_texts(findings).items():
                errors[field] = [*errors.get(field, []), *texts]
            raise DeploymentInputError(errors=errors, findings=findings) from None
        return Checked(spec, findings, [], {}, refusal.errors)
    findings, each = _on_hosts(spec, recipe, data, [c.host for c in choices])
    return Checked(spec, findings, choices, each, {})


def deployment_check(*, data: dict[str, Any]) -> Checked:
    """Pre-flight without deploying: validate, place, and run the rules against the host
    placement chose (each replica's). Raises DeploymentInputError as deploying would."""
    checked = _checked(data)
    if checked.refused:
        raise DeploymentInputError(errors=checked.refused)
    return checked


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
    checked = _checked(data)
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


def _placed(spec: DeploymentSpec, *, replicas: range | list[int], used: list[str] | None = None,
            exclude_pk: int | None = None) -> list[Choice]:
    try:
        return deployment_place(gpus=list(spec.gpus), host=spec.host, replicas=replicas,
                                used=used or [], exclude_pk=exclude_pk)
    except PlacementRefused as exc:
        raise DeploymentInputError(errors={exc.field: [str(exc)]}) from None


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
        choices = _placed(spec, replicas=wanted,
                          used=[rows[i].host for i in sorted(running) if i < replicas])
        # Each host a replica goes to is pre-flighted as a new deployment's would be.
        each = _on_hosts(spec, _recipe_for(root.spec), root.spec,
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
