"""Tune: create (validated: a ready deployment, its inputs, its candidates), run (the Celery
task's body, on the bench queue: appliance.tune.run_tune with the deployment's own row as its
Deployer), cancel, Apply (the winner redeployed: rolling over replicas, one at a time, else
stop and start again), and the sweep of Tunes whose task is gone. Rows change state through
web/benchmarks/runs.py.

While a Tune runs, its deployment's replica 0 serves its candidates one after another, not
its own spec, out of the gateway's rotation (drained); a deployment with replicas keeps
serving on the others. The row's `tune_hold` says so, and until when, for its page and API;
the Tune empties it when it gives the deployment back, restored.

A running Tune's task writes its progress with a beat every POLL_S; `tune_sweep` (the
panel loop, web/loop.py) sends the task again for one whose beat stopped TUNE_LOST_S ago (its worker
died: the task, delivered again, restores and ends it) or that no worker took, and ends one
that no worker takes even then.
"""

from __future__ import annotations

import threading
import time
import traceback
from datetime import timedelta
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
from web.deploy import services as deploying
from web.deployments import services as deployments
from web.deployments.models import (
    Deployment,
    DeploymentStatus,
    EventKind,
)
from web.deployments.services.rolling import ROLLING, deployment_has_replicas, deployment_replicas
from web.deployments.simulator import image_is_simulator
from web.fleet.leases import lease_host
from web.fleet.placement import placement_candidates

from .choices import ACTIVE_STATUSES, BenchmarkStatus
from .runs import run_claim, run_finish, run_polled, run_request_cancel
from .services import BenchmarkInputError, target_name
from .tune_deployers import POLL_S, STOP_WAIT_S, PanelDeployer, deployer_for, side_name
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
# A running Tune whose task wrote no beat for settings.TUNE_LOST_S: its worker is gone (the
# task beats every POLL_S, its restore included). A queued one that no worker took this
# long: its message is lost (as a queued deployment's, web/builder/requeue.py's
# QUEUED_GRACE_S).
QUEUED_LOST_S = 600.0
# A copy of the task that finds its Tune running watches this long for a beat before it
# takes the Tune over (a live worker beats every POLL_S).
ALIVE_CHECK_S = 6 * POLL_S
# The bound on an Apply's rolling redeploy, per replica, beyond its deploy timeout.
ROLL_SLACK_S = 300.0


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


def tune_hold(*, deployment_id: int) -> dict[str, Any] | None:
    """The Tune that holds the deployment now (the row's `tune_hold`): its id, what it
    holds, until when; None when none does."""
    hold = Deployment.objects.filter(pk=deployment_id).values_list("tune_hold", flat=True)
    found = next(iter(hold), None)
    return dict(found) if found else None


def _hold_take(run: TuneRun) -> None:
    """The deployment held by this Tune from now until its budget ends, then its restore
    (each candidate's start, and the restore's, bounded by deploy_timeout_s)."""
    rows = run.original.get("rows") or [{"replica": 0, "gpus": run.original["gpus"]}]
    now = timezone.now()
    until = now + timedelta(seconds=run.config.get("time_budget_s", 3600))
    restored_by = until + timedelta(seconds=run.config.get("deploy_timeout_s", 1800) + 2 * (
        settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S))
    gpus = ", ".join(str(g) for g in rows[0]["gpus"])
    if len(rows) > 1:
        holds = f"replica 0 (GPUs {gpus})"
        text = (f"replica 0 (GPUs {gpus}) is out of service for Tune #{run.pk} (its "
                f"candidates run in its place, out of the gateway's rotation) while replicas "
                f"1 to {len(rows) - 1} keep serving, until {until:%Y-%m-%d %H:%M} UTC at the "
                f"latest, restored by {restored_by:%H:%M} UTC")
    else:
        holds = f"the deployment (GPUs {gpus})"
        text = (f"the deployment is out of service for Tune #{run.pk} (its candidates run "
                f"in its place) until "
                f"{until:%Y-%m-%d %H:%M} UTC at the latest, then restored as it was (by "
                f"{restored_by:%H:%M} UTC)")
    Deployment.objects.filter(pk=run.original["id"]).update(tune_hold={
        "tune": run.pk, "holds": holds, "replica": 0, "gpus": rows[0]["gpus"],
        "serving": len(rows) - 1, "since": now.isoformat(), "until": until.isoformat(),
        "restored_by": restored_by.isoformat(), "text": text})


def _hold_give_back(run_id: int, deployment_id: int | None) -> None:
    if deployment_id is not None:
        Deployment.objects.filter(pk=deployment_id, tune_hold__tune=run_id).update(
            tune_hold={})


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
    if config.get("placement") == "side_by_side":
        if not _side_still_free(run):
            return "failed"
    else:
        _hold_take(run)
    candidates = [Candidate(c["name"], c["engine"]) for c in config["candidates"]]
    options = TuneOptions(levels=tuple(config["levels"]), warmup=config["warmup"],
                          time_budget_s=config["time_budget_s"],
                          lossless_max_tokens=config["lossless_max_tokens"],
                          threshold=config["threshold"], seed=config["seed"])
    progress, outcome = TuneProgress(), dict[str, Any]()
    deployer = deployer_for(run)
    held = (tune_hold(deployment_id=run.original["id"]) or {}).get("text") or (
        f"the deployment serves on while they run beside it, on GPUs "
        f"{run.config.get('side', {}).get('gpus')} (as {side_name(run)})")
    _note(run, f"Tune #{run.pk} began: {held}; its {len(candidates)} candidates run one "
          "after another")

    def work(cancel: threading.Event) -> None:
        try:
            outcome["result"] = run_tune(candidates, deployer, prompts,
                                         _lossless_prompts(config, prompts), options,
                                         progress, cancel)
        except Exception:  # run_tune restores and records; this is its own failure
            outcome["error"] = traceback.format_exc()
        finally:
            connection.close()

    run_polled(TuneRun, run_id, work, lambda: {**progress.snapshot(), "beat": _now()},
               name=f"tune-{run_id}")
    return _record(run, outcome, progress, deployer)


def _side_still_free(run: TuneRun) -> bool:
    """The GPUs chosen at create, or others free now of the same kind (another deployment
    may have taken them meanwhile); False when none are: the Tune failed, said why."""
    row = Deployment.objects.filter(pk=run.original["id"]).first()
    if row is None:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error="its deployment is gone")
        return False
    try:
        side = side_gpus(row)
    except BenchmarkInputError as exc:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error=str(exc.errors["placement"]))
        return False
    run.config = {**run.config, "side": side}
    TuneRun.objects.filter(pk=run.pk).update(config=run.config)
    return True


def lost_s() -> float:
    return float(settings.TUNE_LOST_S)


def _now() -> float:
    return round(time.time(), 1)


def _beat(run: TuneRun) -> float:
    """When the Tune's task last showed it lives: its last beat, else its start."""
    beat = (run.progress or {}).get("beat")
    if isinstance(beat, int | float):
        return float(beat)
    return run.started_at.timestamp() if run.started_at else 0.0


def _resumed(run_id: int) -> str:
    """The task delivered again for a Tune already running: while its worker beats, a
    duplicate, which leaves it alone; once its beat stopped (its worker was killed) or the
    sweep sent it again for that, the candidate it left deployed is taken down, the
    deployment restored, and the Tune ends saying so; never left holding the deployment.
    One copy takes it over (a conditional update of the progress it read)."""
    run = TuneRun.objects.filter(pk=run_id, status__in=[
        BenchmarkStatus.RUNNING, BenchmarkStatus.CANCELLING]).first()
    if run is None:
        return "not queued"
    progress = dict(run.progress or {})
    beat, resent = _beat(run), progress.get("resent")
    if time.time() - beat < lost_s() and not (isinstance(resent, int | float) and
                                              resent >= beat):
        return "running elsewhere"
    time.sleep(ALIVE_CHECK_S)  # a worker still alive beats meanwhile: the update below misses
    taken = {**progress, "phase": "restoring", "beat": _now(), "resumed": _now()}
    if not TuneRun.objects.filter(pk=run_id, progress=run.progress).update(progress=taken):
        return "taken over elsewhere"
    outcome: dict[str, Any] = {}

    def work(cancel: threading.Event) -> None:
        try:
            outcome["restored"] = {"ok": True, "message": deployer_for(run).restore()}
        except Exception as exc:
            outcome["restored"] = {"ok": False,
                                   "message": f"the deployment could not be restored: {exc}"}
        finally:
            connection.close()

    run_polled(TuneRun, run_id, work, lambda: {**taken, "beat": _now()},
               name=f"tune-{run_id}-restore")
    restored = outcome["restored"]
    run_finish(TuneRun, run_id, BenchmarkStatus.FAILED,
               results={**(run.results or {}), "restore": restored},
               error="the worker running this Tune stopped mid-run; the Tune ended and "
                     f"the deployment was restored: {restored['message']}")
    _hold_give_back(run_id, run.deployment_id)
    _note(run, f"Tune #{run.pk} ended (its worker stopped mid-run); {restored['message']}")
    return "failed"


def tune_sweep(*, now: float | None = None) -> list[str]:
    """Tunes whose task is gone (the panel loop, every 10 s): a running one
    whose beat stopped TUNE_LOST_S ago, or a queued one no worker took in QUEUED_LOST_S, is
    sent to the workers once more (the task, for a running one, restores the deployment and
    ends it); one no worker takes up in QUEUED_LOST_S even then is ended, saying why. What
    it did, in words."""
    now = time.time() if now is None else now
    said: list[str] = []
    for run in TuneRun.objects.filter(status__in=list(ACTIVE_STATUSES)):
        progress = dict(run.progress or {})
        resent = progress.get("resent")
        if run.status == BenchmarkStatus.QUEUED:
            since = run.created_at.timestamp()
            lost = "no worker took it"
        else:
            since = _beat(run)
            lost = "its worker stopped (no beat)"
        if now - since < (QUEUED_LOST_S if run.status == BenchmarkStatus.QUEUED else lost_s()):
            continue
        if not isinstance(resent, int | float) or resent < since:
            if TuneRun.objects.filter(pk=run.pk, progress=run.progress).update(
                    progress={**progress, "resent": now}):
                tasks.tune_run_later(run.pk)
                said.append(f"Tune #{run.pk}: {lost} for {now - since:.0f} s; sent to the "
                            "workers again")
            continue
        # Sent again: a worker (one restarting, say) has as long as a queued Tune to take it.
        if now - resent >= QUEUED_LOST_S:
            said.append(_ended_lost(run, lost, now - since))
    return said


def _ended_lost(run: TuneRun, lost: str, waited: float) -> str:
    """The Tune ended after no worker took it up again: a queued one never touched the
    deployment; a running one leaves it where its worker stopped, said on the Tune and in
    the deployment's log, and gives up its hold (the operator can act on it)."""
    if run.status == BenchmarkStatus.QUEUED:
        why = (f"no worker took this Tune in {waited:.0f} s, even when sent again (its task "
               "message was lost, or no worker consumes the bench queue); the deployment "
               "was never touched")
        ended = bool(TuneRun.objects.filter(pk=run.pk, status=BenchmarkStatus.QUEUED).update(
            status=BenchmarkStatus.FAILED, finished_at=timezone.now(), error=why))
    else:
        row = Deployment.objects.filter(pk=run.original.get("id")).first()
        where = ("gone" if row is None else
                 "on its own spec" if row.spec == run.original.get("spec") else
                 f"{row.status} on a candidate's spec: Redeploy it with its own spec")
        if run.config.get("placement") == "side_by_side":
            where += (f", and its side deployment {side_name(run)} as it was: Stop and "
                      "Delete it")
        why = (f"{lost} for {waited:.0f} s and no worker took it up again to restore the "
               f"deployment; it was left {where}")
        ended = run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error=why, results={
            **(run.results or {}), "restore": {"ok": False, "message": why}})
        if ended and row is not None:
            Deployment.objects.filter(pk=row.pk, spec=run.original.get("spec")).update(
                draining=False)
    if ended:
        _hold_give_back(run.pk, run.deployment_id)
        _note(run, f"Tune #{run.pk} ended: {why}")
    return f"Tune #{run.pk}: {why}"


def _record(run: TuneRun, outcome: dict[str, Any], progress: TuneProgress,
            deployer: PanelDeployer) -> str:
    snapshot = progress.snapshot()
    if "error" in outcome:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, progress=snapshot,
                   error=outcome["error"][-4000:])
        _hold_give_back(run.pk, run.deployment_id)
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
    _hold_give_back(run.pk, run.deployment_id)
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


def _apply_rolling(run: TuneRun, row: Deployment, candidate: Candidate,
                   spec: dict[str, Any]) -> str:
    """The winner over every replica by the rolling redeploy (rolling.py: one replica at a
    time, drained first, the others serving), followed until the roll ends, bounded."""
    deploying.deployment_redeploy(deployment_id=row.pk, data=spec, user=run.created_by,
                                  confirm_warnings=True)
    count = len(deployment_replicas(deployment=row))
    _applied(run.pk, state="rolling", message=f"rolling redeploy of {row.name} with "
             f"{candidate.name} under way (one replica at a time, {count} replicas)")
    bound = time.monotonic() + count * (float(run.config.get("deploy_timeout_s", 1800)) +
                                        settings.ROLL_DRAIN_TIMEOUT_S + ROLL_SLACK_S)
    rolling: dict[str, Any] = {}
    while time.monotonic() < bound:
        rolling = Deployment.objects.filter(pk=row.pk).values_list(
            "rolling", flat=True).first() or {}
        if rolling.get("state") != ROLLING:
            break
        time.sleep(POLL_S)
    text = rolling.get("text") or rolling.get("state") or "no roll found"
    if rolling.get("state") == "done":
        _applied(run.pk, state="done", message=f"{row.name} redeployed with "
                 f"{candidate.name}, rolling: {text}")
        return "done"
    if rolling.get("state") == ROLLING:
        text = f"still rolling after the bound: {text}"
    _applied(run.pk, state="failed", message=text)
    return "failed"


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
            return _apply_rolling(run, row, candidate, spec)
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
