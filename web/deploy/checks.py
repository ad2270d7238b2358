"""A spec checked before it is deployed: validated under its recipe's engine defaults,
placed (web/fleet/placement.py: a read, nothing is stored), then pre-flighted against the
facts of the hosts placement chose (their GPUs, Docker, secret store) and the model store's
entries. Placement comes first, so the rules judge the host the spec will run on."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from appliance.engine.envkeys import env_key_errors
from appliance.engine.extra_args import absorb, original_field
from appliance.engine.recipes import Recipe, RecipeError
from appliance.engine.spec import (
    DeploymentSpec,
    SpecError,
    engine_base_types,
    spec_from_dict,
)
from appliance.preflight import Finding, has_errors, run_preflight
from web.deployments.services.deployments import (
    recipe_load,
    recipe_names,
)
from web.deployments.services.errors import DeploymentInputError
from web.deployments.services.hosts import (
    host_driver_findings,
    host_gpu_findings,
    host_gpu_inventory_findings,
)
from web.deployments.services.modelfiles import local_model_facts
from web.fleet.hostfacts import host_facts
from web.fleet.placement import Choice, PlacementRefused, deployment_place
from web.store.loadtime import (
    deployment_entries_resolve,
    store_facts,
)


def _spec_errors(exc: SpecError) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for item in exc.errors:
        text = f"{item.message} {item.fix}".strip() if item.fix else item.message
        errors.setdefault(item.field or "non_field_errors", []).append(text)
    return errors


def recipe_for(data: dict[str, Any]) -> Recipe | None:
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


def parsed(data: dict[str, Any]) -> tuple[dict[str, Any], DeploymentSpec, Recipe | None]:
    """The spec under its recipe's engine defaults, or DeploymentInputError naming each bad
    field."""
    data, entry_errors = deployment_entries_resolve(data=data)  # models named by store entry
    if entry_errors:
        raise DeploymentInputError(errors=entry_errors)
    recipe = recipe_for(data)
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


def on_hosts(spec: DeploymentSpec, recipe: Recipe | None, data: dict[str, Any],
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
    data, spec, recipe = parsed(data)
    findings, _ = on_hosts(spec, recipe, data, list(hosts) or [str(settings.HOST_NAME)])
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


def spec_checked(data: dict[str, Any]) -> Checked:
    """Place the spec's replicas, then run pre-flight against the chosen hosts' facts.

    Where placement refuses, the rules that need no host still run: their errors come with
    the refusal (raised); alone, the refusal is left to the caller (Checked.refused)."""
    data, spec, recipe = parsed(data)
    try:
        choices = placed(spec, replicas=range(spec.replicas))
    except DeploymentInputError as refusal:
        findings = _rules(spec, recipe, data, None)
        if has_errors(findings):
            errors = dict(refusal.errors)
            for field, texts in _error_texts(findings).items():
                errors[field] = [*errors.get(field, []), *texts]
            raise DeploymentInputError(errors=errors, findings=findings) from None
        return Checked(spec, findings, [], {}, refusal.errors)
    findings, each = on_hosts(spec, recipe, data, [c.host for c in choices])
    return Checked(spec, findings, choices, each, {})


def deployment_check(*, data: dict[str, Any]) -> Checked:
    """Pre-flight without deploying: validate, place, and run the rules against the host
    placement chose (each replica's). Raises DeploymentInputError as deploying would."""
    checked = spec_checked(data)
    if checked.refused:
        raise DeploymentInputError(errors=checked.refused)
    return checked


def placed(spec: DeploymentSpec, *, replicas: range | list[int], used: list[str] | None = None,
            exclude_pk: int | None = None) -> list[Choice]:
    try:
        return deployment_place(gpus=list(spec.gpus), host=spec.host, replicas=replicas,
                                used=used or [], exclude_pk=exclude_pk)
    except PlacementRefused as exc:
        raise DeploymentInputError(errors={exc.field: [str(exc)]}) from None


