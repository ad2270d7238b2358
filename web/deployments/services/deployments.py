"""Writes: creating deployments, moving their status, requesting a stop.

Every status change is one function per edge, a conditional UPDATE on the
expected source states; zero rows updated means someone else won.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from appliance.engine.envkeys import env_key_errors
from appliance.engine.extra_args import absorb, original_field
from appliance.engine.recipes import Recipe, RecipeError, list_recipes, load_recipe
from appliance.engine.spec import (
    DeploymentSpec,
    SpecError,
    engine_base_types,
    spec_from_dict,
    spec_to_dict,
)
from appliance.engine.widths import needed_graph_widths
from appliance.preflight import Finding, has_errors, run_preflight

from ..models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    Deployment,
    DeploymentStatus,
    EventKind,
)
from .events import events_append
from .hosts import (
    host_gpu_findings,
    host_gpu_inventory,
    host_gpu_inventory_findings,
    host_secret_names,
)
from .leases import gpu_leases_acquire, gpu_leases_release
from .loadtime import (
    deployment_entries_resolve,
    load_estimate,
    root_read_rate_request,
    store_facts,
    unmeasured_roots,
)
from .modelfiles import local_model_facts
from .served_names import served_name_conflict

S = DeploymentStatus


# ---------------------------------------------------------------- validation


@dataclass
class DeploymentInputError(Exception):
    """Bad input: field -> messages, plus the pre-flight findings that blocked it."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    needs_confirmation: bool = False

    def __str__(self) -> str:
        return "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())


def _spec_errors(exc: SpecError) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for item in exc.errors:
        text = f"{item.message} {item.fix}".strip() if item.fix else item.message
        errors.setdefault(item.field or "non_field_errors", []).append(text)
    return errors


def recipe_names() -> list[str]:
    """Shipped recipes, then the site's own (APPLIANCE_RECIPES_DIR) under their file names."""
    return sorted(set(list_recipes()) | set(_site_recipes()))


def _site_recipes() -> dict[str, str]:
    if not settings.RECIPES_DIR:
        return {}
    return {p.stem: str(p) for p in Path(settings.RECIPES_DIR).glob("*.yaml")}


def recipe_load(name: str) -> Recipe:
    """A recipe by name: the site's file of that name wins over a shipped one."""
    return load_recipe(_site_recipes().get(name, name))


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


def deployment_validate(*, data: dict[str, Any]) -> tuple[DeploymentSpec, list[Finding]]:
    """Validate a spec under its recipe's engine defaults and run pre-flight.

    Raises DeploymentInputError naming each bad field, or the pre-flight errors.
    """
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
    # Only files under the model roots are read here (modelfiles.py), never a path as given.
    findings = run_preflight(spec, recipe=recipe, read_local_configs=False,
                             host_gpus=host_gpu_inventory(),
                             **store_facts(spec, local_model_facts(spec)),
                             secret_names=host_secret_names(directory=settings.ENGINE_SECRETS_DIR))
    findings += host_gpu_findings(gpus=list(spec.gpus), gpu_requests=settings.ENGINE_GPU_REQUESTS)
    findings += host_gpu_inventory_findings(gpus=list(spec.gpus), configured=settings.GPU_COUNT)
    findings = _as_written(findings, data)
    if has_errors(findings):
        errors: dict[str, list[str]] = {}
        for finding in findings:
            if finding.severity == "error":
                errors.setdefault(finding.field or "non_field_errors", []).append(
                    f"{finding.message} Fix: {finding.fix} [{finding.rule}]"
                )
        raise DeploymentInputError(errors=errors, findings=findings)
    return spec, findings


def deployment_create(
    *,
    data: dict[str, Any],
    user: AbstractBaseUser | AnonymousUser | None = None,
    confirm_warnings: bool = False,
    rebuild_image: bool = False,
) -> Deployment:
    """Validate, pre-flight, store, and queue the deploy task once the row is committed.

    rebuild_image builds the engine image without the cache even when its tag exists
    (a moved base image tag, a suspect earlier build).
    """
    spec, findings = deployment_validate(data=data)
    warnings = [f for f in findings if f.severity == "warning"]
    if warnings and not confirm_warnings:
        raise DeploymentInputError(
            errors={"confirm_warnings": ["Pre-flight has warnings; confirm to deploy anyway."]},
            findings=findings,
            needs_confirmation=True,
        )
    with transaction.atomic():
        # Another active deployment of this served name is a 400 naming it; nothing stored.
        taken = served_name_conflict(spec=spec_to_dict(spec), name=spec.name)
        deployment = Deployment.objects.create(
            name=spec.name,
            spec=spec_to_dict(spec),
            recipe=spec.recipe,
            algorithm=spec.engine.speculative_algorithm,
            gpus=list(spec.gpus),
            preflight=[f.to_dict() for f in findings],
            load_estimate=load_estimate(spec),
            graph_needed=needed_graph_widths(spec.engine) or {},
            rebuild_image=rebuild_image,
            created_by=user if user is not None and user.is_authenticated else None,  # type: ignore[misc]
        )
        # In this transaction: a GPU another deployment holds rolls the row back (400), and
        # so does a taken name; both said at once (a Clone as it is takes both).
        try:
            gpu_leases_acquire(deployment=deployment)
        except DeploymentInputError as exc:
            raise DeploymentInputError(errors={**taken, **exc.errors}) from None
        if taken:
            raise DeploymentInputError(errors=taken)
        events_append(
            deployment_id=deployment.pk,
            events=[
                ("status", {"status": S.QUEUED, "message": "deployment queued"}),
                ("preflight", {"findings": [f.to_dict() for f in findings]}),
            ],
        )
        transaction.on_commit(lambda: _enqueue("worker.tasks.deploy", deployment.pk))
        for root in unmeasured_roots(spec):  # the Weights card compares the load with it
            root_read_rate_request(root=root)
    return deployment


def _enqueue(task_name: str, deployment_id: int) -> None:
    from worker.celery import app

    app.send_task(task_name, args=[deployment_id])  # queue by task (worker/celery.py routes)


# --------------------------------------------------------------- transitions


def _transition(
    deployment_id: int, *, sources: Iterable[str], target: str, message: str = "", **fields: Any
) -> bool:
    now = timezone.now()
    with transaction.atomic():
        updated = Deployment.objects.filter(pk=deployment_id, status__in=list(sources)).update(
            status=target, updated_at=now, **fields
        )
        if updated:
            _note_status_time(deployment_id, target, now)
            if target in TERMINAL_STATUSES:
                gpu_leases_release(deployment_id=deployment_id)  # ended: its GPUs are free
            events_append(
                deployment_id=deployment_id,
                events=[(EventKind.PHASE, {"status": target, "message": message})],
            )
    return bool(updated)


def _note_status_time(deployment_id: int, status: str, now: Any) -> None:
    """When each status began (the phase durations); the UPDATE before holds the row."""
    times = Deployment.objects.values_list("status_times", flat=True).get(pk=deployment_id)
    Deployment.objects.filter(pk=deployment_id).update(
        status_times={**(times or {}), status: now.isoformat()})


def deployment_mark_building(*, deployment_id: int) -> bool:
    return _transition(deployment_id, sources=[S.QUEUED], target=S.BUILDING, phase="build")


def deployment_mark_starting(*, deployment_id: int, image: str, start_token: str = "") -> bool:
    return _transition(
        deployment_id, sources=[S.QUEUED, S.BUILDING], target=S.STARTING, phase="start",
        image=image, start_token=start_token, build_owner="", build_lease_until=None,
    )


def deployment_mark_checking(*, deployment_id: int) -> bool:
    return _transition(deployment_id, sources=[S.STARTING], target=S.CHECKING, phase="self_check")


def deployment_mark_loading(*, deployment_id: int) -> bool:
    return _transition(
        deployment_id, sources=[S.STARTING, S.CHECKING], target=S.LOADING, phase="weights"
    )


def deployment_mark_capturing(*, deployment_id: int) -> bool:
    return _transition(
        deployment_id,
        sources=[S.STARTING, S.CHECKING, S.LOADING],
        target=S.CAPTURING,
        phase="cuda_graph",
    )


def deployment_mark_ready(*, deployment_id: int, engine_url: str = "") -> bool:
    fields: dict[str, Any] = {"phase": "serving", "ready_at": timezone.now()}
    if engine_url:
        fields["engine_url"] = engine_url
    return _transition(
        deployment_id,
        sources=[S.STARTING, S.CHECKING, S.LOADING, S.CAPTURING],
        target=S.READY,
        **fields,
    )


def deployment_mark_stopping(*, deployment_id: int) -> bool:
    sources = [s for s in ACTIVE_STATUSES if s not in {S.STOPPING, S.QUEUED}]
    return _transition(deployment_id, sources=sources, target=S.STOPPING, message="stop requested")


def deployment_mark_stopped(*, deployment_id: int) -> bool:
    done = _transition(
        deployment_id,
        sources=[S.STOPPING, S.QUEUED],
        target=S.STOPPED,
        phase="",
        ended_at=timezone.now(),
    )
    if done:
        events_append(deployment_id=deployment_id, events=[(EventKind.END, {"status": S.STOPPED})])
    return done


def deployment_mark_failed(
    *,
    deployment_id: int,
    diagnosis: dict[str, Any],
    last_lines: list[str],
    message: str = "",
    sources: Iterable[str] = ACTIVE_STATUSES,
) -> bool:
    """Failed from an active state, carrying a diagnosis and the engine's last lines.

    The engine agent passes the running states only: an engine that ends while a stop
    is under way has stopped, not failed.
    """
    done = _transition(
        deployment_id,
        sources=list(sources),
        target=S.FAILED,
        message=message or diagnosis.get("summary", ""),
        diagnosis=diagnosis,
        last_lines=last_lines[-60:],
        ended_at=timezone.now(),
    )
    if done:
        events_append(
            deployment_id=deployment_id,
            events=[
                (EventKind.DIAGNOSIS, diagnosis),
                (EventKind.END, {"status": S.FAILED, "message": message}),
            ],
        )
    return done


ADVANCE = {
    "checking": deployment_mark_checking,
    "loading": deployment_mark_loading,
    "capturing": deployment_mark_capturing,
    "ready": deployment_mark_ready,
}


def deployment_request_stop(*, deployment: Deployment) -> Deployment:
    """A queued deployment stops at once; a running one goes to stopping and the worker stops it."""
    pk = deployment.pk
    if deployment_mark_stopped(deployment_id=pk):
        return Deployment.objects.get(pk=pk)
    if deployment_mark_stopping(deployment_id=pk):
        transaction.on_commit(lambda: _enqueue("worker.tasks.stop", pk))
    return Deployment.objects.get(pk=pk)


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
