"""Benchmark runs: create (validated, with a snapshot of each deployment), run (the Celery
task's body), cancel. Rows change state only through conditional UPDATEs."""

from __future__ import annotations

import threading
import traceback
from typing import Any

from django.conf import settings
from django.db import transaction

from appliance.bench import (
    BenchOptions,
    Progress,
    PromptError,
    Target,
    load_prompts,
    run_benchmark,
    speedups,
)
from appliance.bench.runner import MODES, BenchCancelled, BenchUnreachable, RunResult
from web import tasks
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.simulator import SIMULATOR_MARK, image_is_simulator
from web.gateway.services import ApiKeyError, apikey_create, apikey_revoke

from .choices import BenchmarkStatus
from .models import BenchmarkRun
from .runs import run_cancelling, run_claim, run_finish, run_request_cancel

MAX_LEVEL, MAX_PROMPTS, MAX_LEN = 1024, 10000, 131072
POLL_S = 0.5


class BenchmarkInputError(Exception):
    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def target_name(deployment: Deployment) -> str:
    """How results name a deployment: `name#id`, marked `(simulator)` when its image is the
    simulator's, so that every table, chart, verdict and export of its figures says so."""
    name = f"{deployment.name}#{deployment.pk}"
    if image_is_simulator(image=deployment.image):
        return f"{name} ({SIMULATOR_MARK})"
    return name


def _snapshot(deployment: Deployment) -> dict[str, Any]:
    return {"id": deployment.pk, "name": target_name(deployment), "spec": deployment.spec,
            "image": deployment.image, "engine_url": deployment.engine_url,
            "algorithm": deployment.algorithm, "recipe": deployment.recipe}


def _served(deployment: Deployment) -> str:
    """The name the gateway routes by: the spec's served_model_name, else the name."""
    return str((deployment.spec.get("engine") or {}).get("served_model_name")
               or deployment.name)


def _gateway_target(deployment: Deployment, user: Any, field: str) -> dict[str, Any]:
    """The deployment as its clients call it: the panel's /v1 with a key of the run's own
    (made when it runs), whichever replicas serve. `field`: the option a refusal names."""
    if not settings.GATEWAY_URL:
        raise BenchmarkInputError({field: "benchmarking through the gateway needs "
                                   "APPLIANCE_GATEWAY_URL (compose: http://web:8000)"})
    if not getattr(user, "is_authenticated", False):
        raise BenchmarkInputError({field: "the gateway is called with a key of the "
                                   "user who starts the run: log in"})
    return {"id": deployment.pk, "name": f"{target_name(deployment)} through the gateway",
            "route": "gateway", "served_model": _served(deployment),
            "engine_url": settings.GATEWAY_URL, "spec": deployment.spec,
            "image": deployment.image, "algorithm": deployment.algorithm,
            "recipe": deployment.recipe}


def _replica_targets(deployment: Deployment) -> list[dict[str, Any]]:
    """Each ready replica of a deployment, its engine called alone."""
    rows = [deployment, *Deployment.objects.filter(replica_of=deployment)
            .order_by("replica_index")]
    name = target_name(deployment)
    return [{**_snapshot(row), "name": f"{name} replica {row.replica_index}",
             "replica": row.replica_index} for row in rows
            if row.status == DeploymentStatus.READY and row.engine_url]


def _ready_deployments(ids: list[int]) -> list[Deployment]:
    if not 1 <= len(ids) <= 3 or len(set(ids)) != len(ids):
        raise BenchmarkInputError({"deployments": "choose one, two or three deployments"})
    found = {d.pk: d for d in Deployment.objects.filter(pk__in=ids)}
    for pk in ids:
        d = found.get(pk)
        if d is None or d.status != DeploymentStatus.READY or not d.engine_url:
            raise BenchmarkInputError({"deployments": f"deployment {pk} is not ready"})
    return [found[pk] for pk in ids]


def _check_config(config: dict[str, Any]) -> None:
    levels = config["levels"]
    if not levels or any(not 1 <= c <= MAX_LEVEL for c in levels):
        raise BenchmarkInputError({"levels": f"concurrency levels from 1 to {MAX_LEVEL}"})
    if config["mode"] not in MODES:
        raise BenchmarkInputError({"mode": f"one of {', '.join(MODES)}"})
    for key, top in (("num_prompts", MAX_PROMPTS), ("input_len", MAX_LEN),
                     ("output_len", MAX_LEN)):
        if not 1 <= config[key] <= top:
            raise BenchmarkInputError({key: f"from 1 to {top}"})


def _prompts(config: dict[str, Any], text: str) -> list[Any]:
    try:
        return load_prompts(source=config["prompt_source"], count=config["num_prompts"],
                            input_len=config["input_len"], output_len=config["output_len"],
                            seed=config["seed"], text=text)
    except PromptError as exc:
        raise BenchmarkInputError({exc.field: str(exc)}) from exc


def benchmark_create(*, deployment_ids: list[int], config: dict[str, Any],
                     prompts_text: str = "", baseline_id: int | None = None,
                     name: str = "", user: Any = None, per_replica: bool = False,
                     through_gateway: bool = False) -> BenchmarkRun:
    """`config`: levels, num_prompts, input_len, output_len, prompt_source, mode, warmup,
    seed, request_rate. The baseline defaults to the last deployment chosen.

    per_replica: one deployment, run through the gateway (its aggregate: the baseline) and
    against each of its ready replicas alone; the results add the replicas' throughput
    summed (`replica_sum`). through_gateway: one deployment through the gateway alone, as
    its clients call it (whichever replicas serve, through a rolling change too)."""
    deployments = _ready_deployments(deployment_ids)
    _check_config(config)
    _prompts(config, prompts_text)
    if per_replica or through_gateway:
        field = "per_replica" if per_replica else "through_gateway"
        if len(deployments) != 1:
            raise BenchmarkInputError({field: "choose one deployment to benchmark through "
                                       "the gateway"})
        targets = [_gateway_target(deployments[0], user, field)]
        if per_replica:
            targets += _replica_targets(deployments[0])
        config = {**config, field: True, "baseline": targets[0]["name"]}
    else:
        base = baseline_id if baseline_id is not None else deployment_ids[-1]
        if base not in deployment_ids:
            raise BenchmarkInputError({"baseline": "the baseline must be one of the "
                                       "deployments"})
        targets = [_snapshot(d) for d in deployments]
        config = {**config, "baseline": target_name(next(d for d in deployments
                                                         if d.pk == base))}
    with transaction.atomic():
        run = BenchmarkRun.objects.create(
            name=name, config=config, prompts_text=prompts_text, targets=targets,
            created_by=user if getattr(user, "is_authenticated", False) else None)
        run.deployments.set(deployments)
        tasks.benchmark_run_later(run.pk)
    return run



def benchmark_request_cancel(*, run: BenchmarkRun) -> BenchmarkRun:
    """A queued run ends at once; a running one is asked to stop (its task polls)."""
    return run_request_cancel(run)


def _finish(run_id: int, status: str, **fields: Any) -> None:
    run_finish(BenchmarkRun, run_id, status, **fields)


def benchmark_run(*, run_id: int) -> str:
    """The task's body: runs the sweep on a thread, saving progress and watching for a
    cancel every POLL_S seconds (ORM calls stay on this thread, off the event loop)."""
    if not run_claim(BenchmarkRun, run_id):
        return "not queued"
    run = BenchmarkRun.objects.get(pk=run_id)
    progress, cancel = Progress(), threading.Event()
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=_sweep, args=(run, progress, cancel, outcome),
                              name=f"benchmark-{run_id}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(POLL_S)
        BenchmarkRun.objects.filter(pk=run_id).update(progress=progress.snapshot())
        if run_cancelling(BenchmarkRun, run_id):
            cancel.set()
    return _record(run, outcome, progress)


def _sweep(run: BenchmarkRun, progress: Progress, cancel: threading.Event,
           outcome: dict[str, Any]) -> None:
    key = None
    try:
        config = run.config
        if any(t.get("route") == "gateway" for t in run.targets):
            key = _run_key(run)
        targets = [_target(t, key.secret if key is not None else "") for t in run.targets]
        options = BenchOptions(levels=tuple(config["levels"]), warmup=config.get("warmup", 1),
                               seed=config.get("seed", 0), mode=config["mode"],
                               request_rate=config.get("request_rate"))
        outcome["result"] = run_benchmark(targets, _prompts(config, run.prompts_text),
                                          options, progress, cancel)
    except BenchCancelled:
        outcome["cancelled"] = True
    except BenchUnreachable as exc:  # no traceback: the message says it all
        outcome["error"] = str(exc)
    except ApiKeyError as exc:
        outcome["error"] = f"the run could not make its gateway key: {exc}"
    except Exception:  # recorded on the row: the run failed, the worker goes on
        outcome["error"] = traceback.format_exc()
    finally:
        if key is not None:
            apikey_revoke(prefix=key.key.prefix)


def _target(snapshot: dict[str, Any], secret: str) -> Target:
    if snapshot.get("route") == "gateway":
        return Target(snapshot["name"], snapshot["engine_url"].rstrip("/"),
                      model=snapshot["served_model"], api_key=secret)
    return Target(snapshot["name"], snapshot["engine_url"].rstrip("/"))


def _run_key(run: BenchmarkRun) -> Any:
    """A key of the run's own, for the user who started it, scoped to the deployment: its
    secret stays in this process (never on the row, in an event or an answer); the keys
    page lists it with its usage, revoked when the run ends."""
    if run.created_by is None:
        raise ApiKeyError("owner", "the user who started the run is gone")
    ids = sorted({t["id"] for t in run.targets if t.get("route") == "gateway"})
    return apikey_create(owner_username=run.created_by.get_username(),
                         name=f"benchmark #{run.pk}", deployment_ids=ids)


def replica_sum(results: dict[str, Any], targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replicas' throughput summed per level: N replicas each at `c` clients is the
    deployment serving N x c clients, drawn at that concurrency beside the gateway's line."""
    replicas = {t["name"] for t in targets if "replica" in t}
    if not replicas:
        return []
    deployment = next(t["name"] for t in targets if t.get("route") == "gateway")
    by_level: dict[int, list[dict[str, Any]]] = {}
    for level in results.get("levels", []):
        if level["target"] in replicas:
            by_level.setdefault(level["concurrency"], []).append(level)
    return [{"target": f"{deployment.removesuffix(' through the gateway')} replicas summed",
             "concurrency": c * len(rows), "replicas": len(rows),
             "output_throughput": sum(r["output_throughput"] for r in rows),
             "request_throughput": sum(r["request_throughput"] for r in rows)}
            for c, rows in sorted(by_level.items()) if len(rows) == len(replicas)]


def _record(run: BenchmarkRun, outcome: dict[str, Any], progress: Progress) -> str:
    if outcome.get("cancelled"):
        _finish(run.pk, BenchmarkStatus.CANCELLED, progress=progress.snapshot())
        return "cancelled"
    if "error" in outcome:
        _finish(run.pk, BenchmarkStatus.FAILED, error=outcome["error"][-4000:])
        return "failed"
    result: RunResult = outcome["result"]
    results = {**result.to_dict(), "baseline": run.config["baseline"],
               "speedups": speedups(result, run.config["baseline"])}
    if run.config.get("per_replica"):
        results["replica_sum"] = replica_sum(results, run.targets)
    # Zero requests answered measures nothing: the run failed, with the first error, and
    # keeps its per-level tables (errors counted) to show it.
    failed = result.every_request_failed
    _finish(run.pk, BenchmarkStatus.FAILED if failed else BenchmarkStatus.DONE,
            results=results, progress=progress.snapshot(),
            failed_requests=result.failed_requests,
            error=f"every request failed; the first: {result.first_error()}" if failed else "")
    return "failed" if failed else "done"
