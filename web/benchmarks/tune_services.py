"""Tune: create (validated: a ready deployment of one replica, its inputs, its candidates),
run (the Celery task's body, on the bench queue: appliance.tune.run_tune with the
deployment's own row as its Deployer), cancel, and Apply (the winner redeployed: rolling over
replicas, else stop and start again). Rows change state through web/benchmarks/runs.py.

While a Tune runs, its deployment serves its candidates one after another, not its own
spec: `tune_hold` says so, and until when, for the deployment's page and API.
"""

from __future__ import annotations

import threading
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from appliance.bench.lossless import NEAR_TIE_GAP
from appliance.bench.prompts import SOURCES, Prompt, PromptError, load_prompts
from appliance.bench.verify import SHIPPED_PROMPTS_FILE
from appliance.tune import (
    BASELINE,
    Candidate,
    CandidateError,
    DeployFailed,
    TuneOptions,
    TuneProgress,
    candidate_spec,
    parse_candidates,
    run_tune,
)
from web import tasks
from web.deployments import services as deployments
from web.deployments.models import (
    TERMINAL_STATUSES,
    Deployment,
    DeploymentStatus,
    EventKind,
)
from web.deployments.services.rolling import deployment_has_replicas
from web.deployments.simulator import image_is_simulator

from .choices import ACTIVE_STATUSES, BenchmarkStatus
from .runs import run_claim, run_finish, run_polled, run_request_cancel
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
    "threshold": NEAR_TIE_GAP}
MAX_LEVELS = 8
STOP_WAIT_S = 60.0  # beyond the engine's own stop timeout
POLL_S = 0.5


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
    if deployment_has_replicas(deployment=row):
        raise BenchmarkInputError({"deployment": f"{target_name(row)} has replicas: Tune "
                                   "runs each candidate on the deployment's own GPUs, so "
                                   "scale it to 1 replica, tune, and scale back (Apply "
                                   "rolls the winner over every replica)"})
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


def _lossless_prompts(config: dict[str, Any], prompts: list[Prompt]) -> list[str]:
    """The first of the workload's own prompts (distinct); a synthetic workload's are
    random words, so the shipped set checks it instead."""
    if config["prompt_source"] == "synthetic":
        prompts = tune_prompts({**config, "prompt_source": "builtin"}, "")
    texts = list(dict.fromkeys(p.text for p in prompts))
    return texts[:config["lossless_prompts"]]


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
    original = {"id": row.pk, "name": target_name(row), "spec": row.spec,
                "gpus": list(row.gpus), "status": row.status, "image": row.image,
                "algorithm": row.algorithm, "served_model": _served(row),
                "replicas": int(row.spec.get("replicas") or 1)}
    with transaction.atomic():
        run = TuneRun.objects.create(
            name=name, config=config, deployment=row, original=original,
            prompts_text=prompts_text if config["prompt_source"] in ("jsonl", "sharegpt")
            else "", created_by=user if getattr(user, "is_authenticated", False) else None)
        tasks.tune_run_later(run.pk)
    return run


def tune_request_cancel(*, run: TuneRun) -> TuneRun:
    """A queued Tune ends at once; a running one stops where it is and restores."""
    return run_request_cancel(run)


def tune_hold(*, deployment_id: int) -> dict[str, Any] | None:
    """The Tune that holds the deployment now, and until when at the latest (its budget
    spent, then its restore): for the deployment's page and API; None when none does."""
    run = TuneRun.objects.filter(deployment_id=deployment_id, status__in=[
        BenchmarkStatus.RUNNING, BenchmarkStatus.CANCELLING]).first()
    if run is None:
        return None
    deadline = (run.progress or {}).get("deadline")
    until = (datetime.fromtimestamp(deadline, UTC) if deadline
             else (run.started_at or timezone.now()) + timedelta(
                 seconds=run.config.get("time_budget_s", 3600)))
    return {"tune": run.pk, "until": until.isoformat(),
            "text": f"out of service for Tune #{run.pk} (its candidates run in its place) "
                    f"until {until:%Y-%m-%d %H:%M} UTC at the latest, then restored as it was"}


# ---------------------------------------------------------------- the deployment as Deployer

class PanelDeployer:
    """Each candidate as a redeploy of the deployment's own row (its GPUs, its name, its
    keys), waiting on its status; the restore redeploys the spec it had. Runs on the Tune's
    thread: its own database connection, closed by the caller."""

    def __init__(self, run: TuneRun) -> None:
        self.pk = int(run.original["id"])
        self.original = run.original
        self.user = run.created_by
        self.deploy_timeout_s = float(run.config.get("deploy_timeout_s", 1800))
        self.images: set[str] = set()

    def _spec(self, candidate: Candidate) -> dict[str, Any]:
        return candidate_spec(self.original["spec"], candidate)

    def preflight(self, candidate: Candidate) -> list[str]:
        try:
            deployments.deployment_validate(data=self._spec(candidate))
        except deployments.DeploymentInputError as exc:
            return [f"{field}: {' '.join(msgs)}" for field, msgs in exc.errors.items()]
        return []

    def stop_engine(self) -> None:
        deployments.deployment_stop(deployment_id=self.pk)
        bound = time.monotonic() + settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S
        while time.monotonic() < bound:
            if Deployment.objects.filter(pk=self.pk, status__in=list(
                    TERMINAL_STATUSES)).exists():
                return
            time.sleep(POLL_S)
        raise DeployFailed(f"the deployment did not stop within "
                           f"{settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S:g} s")

    def start_spec(self, spec: dict[str, Any]) -> None:
        try:
            deployments.deployment_redeploy(deployment_id=self.pk, data=spec, user=self.user,
                                            confirm_warnings=True)
        except deployments.DeploymentInputError as exc:
            raise DeployFailed(f"the redeploy was refused: {exc}") from exc

    def wait_ready(self, stop: Any, timeout_s: float) -> str:
        bound = time.monotonic() + timeout_s
        while time.monotonic() < bound:
            row = Deployment.objects.only("status", "engine_url", "image", "diagnosis").get(
                pk=self.pk)
            if row.status == DeploymentStatus.READY and row.engine_url:
                self.images.add(row.image)
                return str(row.engine_url).rstrip("/")
            if row.status == DeploymentStatus.FAILED:
                cause = (row.diagnosis or {}).get("summary") or (row.diagnosis or {}).get(
                    "title") or "see the deployment's page"
                raise DeployFailed(f"its engine failed: {cause}")
            if row.status == DeploymentStatus.STOPPED:
                raise DeployFailed("the deployment was stopped while it started")
            if stop is not None and stop():
                return ""
            time.sleep(POLL_S)
        raise DeployFailed(f"not ready within {timeout_s:g} s")

    def deploy(self, candidate: Candidate, stop: Any) -> str:
        self.stop_engine()
        self.start_spec(self._spec(candidate))
        return self.wait_ready(stop, self.deploy_timeout_s)

    def restore(self) -> str:
        row = Deployment.objects.get(pk=self.pk)
        if row.spec == self.original["spec"] and row.status == DeploymentStatus.READY:
            return f"{self.original['name']} still serves its own spec; nothing to restore"
        self.stop_engine()
        self.start_spec(self.original["spec"])
        self.wait_ready(None, self.deploy_timeout_s)
        return (f"{self.original['name']} serves its own spec again (GPUs "
                f"{self.original['gpus']}, served as {self.original['served_model']})")


# ---------------------------------------------------------------- the task's body

def tune_run(*, run_id: int) -> str:
    if not run_claim(TuneRun, run_id):
        return _resumed(run_id)
    run = TuneRun.objects.select_related("created_by").get(pk=run_id)
    config = run.config
    try:
        prompts = tune_prompts(config, run.prompts_text)
    except BenchmarkInputError as exc:
        run_finish(TuneRun, run_id, BenchmarkStatus.FAILED, error=str(exc))
        return "failed"
    candidates = [Candidate(c["name"], c["engine"]) for c in config["candidates"]]
    options = TuneOptions(levels=tuple(config["levels"]), warmup=config["warmup"],
                          time_budget_s=config["time_budget_s"],
                          lossless_max_tokens=config["lossless_max_tokens"],
                          threshold=config["threshold"], seed=config["seed"])
    progress, outcome = TuneProgress(), dict[str, Any]()
    deployer = PanelDeployer(run)
    until = timezone.now() + timedelta(seconds=options.time_budget_s)
    _note(run, f"Tune #{run.pk} began: out of service while its {len(candidates)} "
          f"candidates run in its place, until {until:%Y-%m-%d %H:%M} UTC at the latest, "
          "then restored as it is now")

    def work(cancel: threading.Event) -> None:
        try:
            outcome["result"] = run_tune(candidates, deployer, prompts,
                                         _lossless_prompts(config, prompts), options,
                                         progress, cancel)
        except Exception:  # run_tune restores and records; this is its own failure
            outcome["error"] = traceback.format_exc()
        finally:
            connection.close()

    run_polled(TuneRun, run_id, work, progress.snapshot, name=f"tune-{run_id}")
    return _record(run, outcome, progress, deployer)


def _resumed(run_id: int) -> str:
    """The task delivered again for a Tune already running (its worker was killed): the
    candidate it left deployed is taken down, the deployment restored, and the Tune ends
    saying so; never left holding the deployment."""
    run = TuneRun.objects.filter(pk=run_id, status__in=[
        BenchmarkStatus.RUNNING, BenchmarkStatus.CANCELLING]).first()
    if run is None:
        return "not queued"
    try:
        restored = {"ok": True, "message": PanelDeployer(run).restore()}
    except Exception as exc:
        restored = {"ok": False, "message": f"the deployment could not be restored: {exc}"}
    run_finish(TuneRun, run_id, BenchmarkStatus.FAILED,
               results={**(run.results or {}), "restore": restored},
               error="the worker running this Tune stopped mid-run; the Tune ended and "
                     f"the deployment was restored: {restored['message']}")
    return "failed"


def _record(run: TuneRun, outcome: dict[str, Any], progress: TuneProgress,
            deployer: PanelDeployer) -> str:
    snapshot = progress.snapshot()
    if "error" in outcome:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, progress=snapshot,
                   error=outcome["error"][-4000:])
        return "failed"
    result = outcome["result"]
    results = {**result.to_dict(),
               "simulator": any(image_is_simulator(image=i) for i in deployer.images)}
    restore = result.restore
    status = {"done": BenchmarkStatus.DONE, "cancelled": BenchmarkStatus.CANCELLED}.get(
        result.ended, BenchmarkStatus.FAILED)
    error = result.reason if result.ended != "done" else ""
    if not restore["ok"]:
        status = BenchmarkStatus.FAILED
        error = f"{error}; {restore['message']}" if error else restore["message"]
    run_finish(TuneRun, run.pk, status, progress=snapshot, results=results, error=error)
    _note(run, f"Tune #{run.pk} ended ({result.ended}"
          f"{': ' + result.reason.splitlines()[-1] if result.reason else ''}); "
          f"{restore['message']}")
    return str(status)


def _note(run: TuneRun, message: str) -> None:
    """A line in the deployment's own event log (its page's timeline, its events API)."""
    if run.deployment_id is not None:
        deployments.events_append(deployment_id=run.deployment_id,
                                  events=[(EventKind.STATUS, {"message": message[:500]})])


# ---------------------------------------------------------------- Apply

def recommended(run: TuneRun) -> str | None:
    """The candidate the recommendation names at the most levels (on a tie, the faster
    summed over its levels); None when it names none."""
    levels = ((run.results or {}).get("recommendation") or {}).get("per_level") or []
    counts: dict[str, list[float]] = {}
    for entry in levels:
        if entry.get("candidate"):
            counts.setdefault(entry["candidate"], []).append(entry["output_throughput"] or 0)
    if not counts:
        return None
    return max(counts, key=lambda name: (len(counts[name]), sum(counts[name])))


def tune_apply(*, run: TuneRun, candidate: str | None = None, user: Any = None) -> TuneRun:
    """Redeploy the Tune's deployment with a recommended candidate (default: `recommended`):
    rolling when it has replicas, else stopped and started on the new spec (a task)."""
    if run.status != BenchmarkStatus.DONE:
        raise BenchmarkInputError({"status": f"Tune #{run.pk} is {run.status}; only a "
                                   "finished Tune is applied"})
    names = {e["candidate"] for e in (run.results.get("recommendation") or {}).get(
        "per_level", []) if e.get("candidate")}
    chosen = candidate or recommended(run)
    if chosen is None or chosen not in names:
        raise BenchmarkInputError({"candidate": f"choose one the Tune recommends: "
                                   f"{sorted(names) or 'none'}"})
    row = (Deployment.objects.filter(pk=run.deployment_id).first()
           if run.deployment_id is not None else None)
    if row is None:
        raise BenchmarkInputError({"deployment": "the Tune's deployment is gone"})
    if (run.applied or {}).get("state") in ("queued", "running"):
        raise BenchmarkInputError({"candidate": "an Apply of this Tune is under way"})
    applied = {"candidate": chosen, "state": "queued", "message": "", "by": getattr(
        user, "username", ""), "at": timezone.now().isoformat()}
    with transaction.atomic():
        TuneRun.objects.filter(pk=run.pk).update(applied=applied)
        tasks.tune_apply_later(run.pk)
    run.refresh_from_db()
    return run


def _applied(run_id: int, **values: Any) -> None:
    run = TuneRun.objects.get(pk=run_id)
    TuneRun.objects.filter(pk=run_id).update(applied={**run.applied, **values})


def tune_apply_run(*, run_id: int) -> str:
    """The Apply task: the candidate's spec on the deployment as it is now."""
    run = TuneRun.objects.select_related("created_by").get(pk=run_id)
    applied = run.applied or {}
    if applied.get("state") != "queued":
        return "not queued"
    _applied(run_id, state="running")
    candidate = next((Candidate(c["name"], c["engine"]) for c in run.config["candidates"]
                      if c["name"] == applied["candidate"]), None)
    row = (Deployment.objects.filter(pk=run.deployment_id).first()
           if run.deployment_id is not None else None)
    if candidate is None or row is None:
        _applied(run_id, state="failed", message="its candidate or deployment is gone")
        return "failed"
    spec = candidate_spec(row.spec, candidate)
    try:
        if deployment_has_replicas(deployment=row):
            deployments.deployment_redeploy(deployment_id=row.pk, data=spec,
                                            user=run.created_by, confirm_warnings=True)
            _applied(run_id, state="rolling", message=f"rolling redeploy of {row.name} "
                     f"with {candidate.name} under way (one replica at a time)")
            return "rolling"
        deployer = PanelDeployer(run)
        deployer.original = {**deployer.original, "spec": row.spec}
        deployer.stop_engine()
        deployer.start_spec(spec)
        deployer.wait_ready(None, deployer.deploy_timeout_s)
    except (DeployFailed, deployments.DeploymentInputError) as exc:
        _applied(run_id, state="failed", message=str(exc))
        return "failed"
    _applied(run_id, state="done", message=f"{row.name} redeployed with {candidate.name}")
    return "done"
