"""Tune: create (validated: a ready deployment, its inputs, its candidates, and for a
side-by-side Tune the free GPUs it runs on) and cancel. Its task and the sweep of Tunes
whose task is gone are tune_task.py's, Apply (the winner redeployed) tune_apply.py's. Rows
change state through web/benchmarks/runs.py.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from appliance.bench.lossless import NEAR_TIE_GAP
from appliance.bench.prompts import SOURCES, Prompt, PromptError, load_prompts
from appliance.bench.verify import SHIPPED_PROMPTS_FILE
from appliance.tune import (
    BASELINE,
    Candidate,
    CandidateError,
    parse_candidates,
)
from web import tasks
from web.deployments.models import (
    Deployment,
    DeploymentStatus,
)
from web.deployments.services.rolling import ROLLING, deployment_replicas
from web.fleet.leases import lease_host
from web.fleet.placement import placement_candidates

from .choices import ACTIVE_STATUSES
from .runs import run_request_cancel
from .services import BenchmarkInputError, target_name
from .tune_models import TuneRun

PROMPT_SOURCES = ("builtin", *SOURCES)
LIMITS = {"num_prompts": (1, 1000), "input_len": (1, 32768), "output_len": (1, 4096),
          "warmup": (0, 16), "time_budget_s": (60, 86400), "deploy_timeout_s": (30, 7200),
          "lossless_prompts": (1, 64), "lossless_max_tokens": (1, 512)}
DEFAULTS: dict[str, Any] = {
    "levels": [1, 8, 32], "num_prompts": 32, "input_len": 256, "output_len": 128,
    "prompt_source": "builtin", "warmup": 2, "seed": 0, "time_budget_s": 3600,
    "deploy_timeout_s": 1800, "lossless_prompts": 8, "lossless_max_tokens": 32,
    "threshold": NEAR_TIE_GAP, "placement": "in_place"}
# in_place: the candidates run on the deployment's own GPUs (replica 0's), the deployment (or
# replica 0) out of service meanwhile; side_by_side: on free GPUs of the same kind on its
# host, as a deployment of their own, while the deployment serves on, untouched.
PLACEMENTS = ("in_place", "side_by_side")
MAX_LEVELS = 8


def _deployment(pk: int | None) -> Deployment:
    row = Deployment.objects.filter(pk=pk).first() if pk is not None else None
    if row is None:
        raise BenchmarkInputError({"deployment": f"no deployment {pk}; choose one"})
    if row.replica_of_id is not None:
        raise BenchmarkInputError({"deployment": f"#{row.pk} is replica {row.replica_index} "
                                   f"of #{row.replica_of_id}: tune #{row.replica_of_id}"})
    if row.status != DeploymentStatus.READY or not row.engine_url:
        raise BenchmarkInputError({"deployment": f"{target_name(row)} is {row.status}; "
                                   "Tune starts from a ready deployment"})
    if (row.rolling or {}).get("state") == ROLLING:
        raise BenchmarkInputError({"deployment": f"{target_name(row)} is in a rolling "
                                   f"change ({row.rolling.get('text', '')}); Tune once it "
                                   "has finished"})
    if TuneRun.objects.filter(deployment=row, status__in=list(ACTIVE_STATUSES)).exists():
        raise BenchmarkInputError({"deployment": f"a Tune of {target_name(row)} is under "
                                   "way; wait for it or cancel it"})
    return row


def _config(raw: dict[str, Any]) -> dict[str, Any]:
    config = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    levels = config["levels"]
    if not isinstance(levels, list) or not 1 <= len(levels) <= MAX_LEVELS or any(
            isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 1024
            for c in levels):
        raise BenchmarkInputError({"levels": f"1 to {MAX_LEVELS} concurrency levels, each "
                                   "from 1 to 1024, e.g. 1,8,32"})
    config["levels"] = sorted(set(levels))
    for key, (low, high) in LIMITS.items():
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                low <= value <= high):
            raise BenchmarkInputError({key: f"from {low} to {high}"})
        config[key] = int(value)
    if config["placement"] not in PLACEMENTS:
        raise BenchmarkInputError({"placement": f"one of {', '.join(PLACEMENTS)}"})
    if config["prompt_source"] not in PROMPT_SOURCES:
        raise BenchmarkInputError({"prompt_source": f"one of {', '.join(PROMPT_SOURCES)}"})
    if not isinstance(config["threshold"], int | float) or not 0 <= config["threshold"] <= 100:
        raise BenchmarkInputError({"threshold": f"a log-prob gap from 0 to 100 (default "
                                   f"{NEAR_TIE_GAP})"})
    return config


def tune_prompts(config: dict[str, Any], text: str) -> list[Prompt]:
    source, body = config["prompt_source"], text
    if source == "builtin":  # the shipped set (appliance/bench/data), as JSONL
        source, body = "jsonl", SHIPPED_PROMPTS_FILE.read_text(encoding="utf-8")
    elif source in ("jsonl", "sharegpt") and not text.strip():
        raise BenchmarkInputError({"prompts": f"upload a {source} file of prompts, or choose "
                                   "the built-in set"})
    try:
        return load_prompts(source=source, count=config["num_prompts"],
                            input_len=config["input_len"], output_len=config["output_len"],
                            seed=config["seed"], text=body)
    except PromptError as exc:
        raise BenchmarkInputError({exc.field: str(exc)}) from exc


def _candidates(row: Deployment, chosen: list[str] | None, extra: Any) -> list[Candidate]:
    try:
        found = parse_candidates(extra, row.engine_options)
    except CandidateError as exc:
        raise BenchmarkInputError({exc.field: str(exc)}) from exc
    if chosen:
        names = {c.name for c in found}
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise BenchmarkInputError({"candidates": f"unknown candidates {unknown[:5]}; "
                                       f"choose from {sorted(names)}"})
        keep = {BASELINE, *chosen, *(c.get("name") for c in (extra or []) if isinstance(
            c, dict))}
        found = [c for c in found if c.name in keep]
    if len(found) < 2:
        raise BenchmarkInputError({"candidates": "choose at least one candidate beside the "
                                   "baseline (no speculation)"})
    return found


def _served(row: Deployment) -> str:
    return str(row.engine_options.get("served_model_name") or row.name)


def tune_create(*, deployment_id: int | None, config: dict[str, Any], prompts_text: str = "",
                candidates: list[str] | None = None, extra_candidates: Any = None,
                name: str = "", user: Any = None) -> TuneRun:
    row = _deployment(deployment_id)
    config = _config(config)
    tune_prompts(config, prompts_text)
    found = _candidates(row, candidates, extra_candidates)
    config["candidates"] = [c.to_dict() for c in found]
    if config["placement"] == "side_by_side":
        config["side"] = side_gpus(row)
    group = deployment_replicas(deployment=row)
    original = {"id": row.pk, "name": target_name(row), "spec": row.spec,
                "gpus": list(row.gpus), "status": row.status, "image": row.image,
                "algorithm": row.algorithm, "served_model": _served(row),
                "replicas": int(row.spec.get("replicas") or 1),
                # Every replica row as it was (replica 0 the first): the others keep serving
                # while replica 0 runs the candidates.
                "rows": [{"id": r.pk, "replica": r.replica_index, "gpus": list(r.gpus),
                          "host": r.host, "status": r.status} for r in group]}
    with transaction.atomic():
        run = TuneRun.objects.create(
            name=name, config=config, deployment=row, original=original,
            prompts_text=prompts_text if config["prompt_source"] in ("jsonl", "sharegpt")
            else "", created_by=user if getattr(user, "is_authenticated", False) else None)
        tasks.tune_run_later(run.pk)
    return run


def side_gpus(row: Deployment) -> dict[str, Any]:
    """Where a side-by-side Tune runs its candidates: free GPUs (held by no deployment) of
    the kind the deployment runs on, on its host, as many as it has; a 400 on `placement`
    naming them when there are not enough."""
    name = lease_host(deployment=row)
    host = placement_candidates().get(name)
    wanted = len(row.gpus)
    kinds = {host.gpus.get(g, "") for g in row.gpus} if host else set()
    free = [g for g in host.free() if host.gpus[g] in kinds] if host else []
    kind = " or ".join(sorted(k or "unnamed (the host reports a count)" for k in kinds)) or (
        "unknown")
    if len(free) < wanted:
        held = "; ".join(f"GPU {g}: {who}" for g, who in sorted(host.held.items())) if host \
            else "the host is not known"
        raise BenchmarkInputError({"placement": (
            f"side by side needs {wanted} free GPU{'s' if wanted != 1 else ''} of the kind "
            f"{kind} on host {name} (as many as {target_name(row)} has); free of that kind: "
            f"{free or 'none'} (held: {held or 'none'}). Run it in_place, or stop a "
            "deployment to free GPUs")})
    return {"host": name, "gpus": free[:wanted], "kind": kind}


def tune_request_cancel(*, run: TuneRun) -> TuneRun:
    """A queued Tune ends at once; a running one stops where it is and restores."""
    return run_request_cancel(run)
