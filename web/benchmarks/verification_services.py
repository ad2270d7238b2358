"""Losslessness checks: create (validated: a ready speculative candidate and a ready baseline
without speculation of the same target model), run (the Celery task's body, on the bench
queue), cancel. Rows change state only through conditional UPDATEs, as benchmark runs do."""

from __future__ import annotations

import asyncio
import threading
import traceback
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.db import transaction

from appliance.bench.lossless import NEAR_TIE_GAP
from appliance.bench.prompts import PromptError, from_jsonl
from appliance.bench.verify import (
    PromptResult,
    VerifyCancelled,
    VerifyError,
    shipped_prompts,
    verify,
)
from appliance.engine.refusals import recipe_source
from web import tasks
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.services import ApiKeyError, apikey_create, apikey_revoke

from .choices import BenchmarkStatus
from .runs import run_cancelling, run_claim, run_finish, run_request_cancel
from .services import BenchmarkInputError, target_name
from .verification_models import VerificationRun

PROMPT_SOURCES = ("builtin", "jsonl")
# direct: each engine's own /generate (token ids compared); gateway: the panel's /v1 by served
# model name, as a client calls them (token texts compared), with a key the check makes for
# itself, scoped to the two deployments and revoked when it ends.
ROUTES = ("direct", "gateway")
MAX_TOKENS, MAX_PROMPTS, MAX_THRESHOLD = 4096, 1000, 100.0
DEFAULT_MAX_TOKENS = 64
POLL_S = 0.5


def target_model(deployment: Deployment) -> str:
    return str((deployment.spec.get("engine") or {}).get("model_path") or "")


def served_model(deployment: Deployment) -> str:
    """The name the gateway routes by (appliance.engine.launch: the spec's, else the
    deployment's name)."""
    return str((deployment.spec.get("engine") or {}).get("served_model_name")
               or deployment.name)


def _snapshot(deployment: Deployment) -> dict[str, Any]:
    # engine_source: its engine build (the recipe's SGLang source, Recipe.source_key), whose
    # refusal table decides whether the check asks the candidate for log-probs.
    return {"id": deployment.pk, "name": target_name(deployment),
            "model": target_model(deployment), "algorithm": deployment.algorithm,
            "image": deployment.image, "engine_url": deployment.engine_url,
            "served_model": served_model(deployment), "recipe": deployment.recipe,
            "engine_source": recipe_source(deployment.recipe, settings.RECIPES_DIR) or ""}


def _ready(pk: int | None, field: str) -> Deployment:
    deployment = Deployment.objects.filter(pk=pk).first() if pk is not None else None
    if deployment is None:
        raise BenchmarkInputError({field: f"choose a deployment (no deployment {pk})"})
    if deployment.status != DeploymentStatus.READY or not deployment.engine_url:
        raise BenchmarkInputError({field: f"deployment {target_name(deployment)} is "
                                   f"{deployment.status}, not ready; choose a ready one"})
    return deployment


def _pair(candidate_id: int | None, baseline_id: int | None) -> tuple[Deployment, Deployment]:
    candidate, baseline = _ready(candidate_id, "candidate"), _ready(baseline_id, "baseline")
    if candidate.pk == baseline.pk:
        raise BenchmarkInputError({"baseline": "choose a deployment other than the candidate"})
    if candidate.algorithm == "NONE":
        raise BenchmarkInputError({"candidate": f"{target_name(candidate)} runs no speculative "
                                   "algorithm; choose the speculative deployment to check"})
    if baseline.algorithm != "NONE":
        raise BenchmarkInputError({"baseline": f"{target_name(baseline)} runs "
                                   f"{baseline.algorithm}; the baseline judges each divergence "
                                   "with its log-probs, so choose one without speculation"})
    if target_model(candidate) != target_model(baseline):
        raise BenchmarkInputError({"baseline": f"{target_name(baseline)} serves "
                                   f"{target_model(baseline)!r}, the candidate "
                                   f"{target_model(candidate)!r}; choose a baseline of the "
                                   "same target model"})
    return candidate, baseline


def verification_prompts(*, source: str, text: str) -> list[str]:
    if source == "builtin":
        return shipped_prompts()
    if source != "jsonl":
        raise BenchmarkInputError({"prompt_source": f"one of {', '.join(PROMPT_SOURCES)}"})
    try:
        prompts = [p.text for p in from_jsonl(text, output_len=1)]
    except PromptError as exc:
        raise BenchmarkInputError({"prompts": f'{exc}; write one {{"prompt": "..."}} a line'}
                                  ) from exc
    if not 1 <= len(prompts) <= MAX_PROMPTS:
        raise BenchmarkInputError({"prompts": f"holds {len(prompts)} prompts; give 1 to "
                                   f"{MAX_PROMPTS}, one JSON line each"})
    return prompts


def _check_config(config: dict[str, Any], user: Any) -> None:
    if config["route"] not in ROUTES:
        raise BenchmarkInputError({"route": f"one of {', '.join(ROUTES)}"})
    if config["route"] == "gateway" and not settings.GATEWAY_URL:
        raise BenchmarkInputError({"route": "the gateway route needs APPLIANCE_GATEWAY_URL "
                                   "(the panel's URL as the worker reaches it, e.g. "
                                   "http://web:8000); choose direct, or set it"})
    if config["route"] == "gateway" and not getattr(user, "is_authenticated", False):
        raise BenchmarkInputError({"route": "the gateway route calls with a key of the user "
                                   "who starts the check; log in"})
    if not 1 <= config["max_tokens"] <= MAX_TOKENS:
        raise BenchmarkInputError({"max_tokens": f"from 1 to {MAX_TOKENS}"})
    if not 0 <= config["threshold"] <= MAX_THRESHOLD:
        raise BenchmarkInputError({"threshold": f"a log-prob gap from 0 to {MAX_THRESHOLD:g} "
                                   f"(default {NEAR_TIE_GAP})"})


def verification_create(*, candidate_id: int | None, baseline_id: int | None,
                        prompt_source: str = "builtin", prompts_text: str = "",
                        max_tokens: int = DEFAULT_MAX_TOKENS, threshold: float = NEAR_TIE_GAP,
                        route: str = "direct", name: str = "",
                        user: Any = None) -> VerificationRun:
    candidate, baseline = _pair(candidate_id, baseline_id)
    config = {"max_tokens": max_tokens, "threshold": threshold, "prompt_source": prompt_source,
              "route": route}
    _check_config(config, user)
    total = len(verification_prompts(source=prompt_source, text=prompts_text))
    with transaction.atomic():
        run = VerificationRun.objects.create(
            name=name, config=config, candidate=candidate, baseline=baseline,
            prompts_text=prompts_text if prompt_source == "jsonl" else "",
            targets={"candidate": _snapshot(candidate), "baseline": _snapshot(baseline)},
            progress={"done": 0, "total": total},
            created_by=user if getattr(user, "is_authenticated", False) else None)
        tasks.verification_run_later(run.pk)
    return run



def verification_request_cancel(*, run: VerificationRun) -> VerificationRun:
    """A queued check ends at once; a running one stops before its next prompt."""
    return run_request_cancel(run)


class _Progress:
    """Per prompt, from the checking thread; read by the task's thread (ORM there only)."""

    def __init__(self, total: int) -> None:
        self.lock = threading.Lock()
        self.total = total
        self.prompts: list[dict[str, Any]] = []

    def add(self, result: PromptResult) -> None:
        with self.lock:
            self.prompts.append(asdict(result))

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            verdicts = [p["verdict"] for p in self.prompts]
            return {"done": len(verdicts), "total": self.total,
                    "identical": verdicts.count("identical"),
                    "near_ties": verdicts.count("near-tie"),
                    "failures": len(verdicts) - verdicts.count("identical")
                    - verdicts.count("near-tie"),
                    "prompts": list(self.prompts)}


def verification_run(*, run_id: int) -> str:
    """The task's body: the check runs on a thread; every POLL_S the row gets its progress
    (each prompt's result as it is judged) and a cancel is looked for."""
    if not run_claim(VerificationRun, run_id):
        return "not queued"
    run = VerificationRun.objects.get(pk=run_id)
    outcome: dict[str, Any] = {}
    cancel = threading.Event()
    try:
        prompts = verification_prompts(source=run.config.get("prompt_source", "builtin"),
                                       text=run.prompts_text)
    except BenchmarkInputError as exc:
        return _record(run, {"error": str(exc)}, _Progress(0))
    progress = _Progress(len(prompts))
    worker = threading.Thread(target=_check, args=(run, prompts, progress, cancel, outcome),
                              name=f"verification-{run_id}", daemon=True)
    worker.start()
    written = -1
    while worker.is_alive():
        worker.join(POLL_S)
        snapshot = progress.snapshot()
        if snapshot["done"] != written:  # each prompt's row once, not every poll
            VerificationRun.objects.filter(pk=run_id).update(progress=snapshot)
            written = snapshot["done"]
        if run_cancelling(VerificationRun, run_id):
            cancel.set()
    return _record(run, outcome, progress)


def _check(run: VerificationRun, prompts: list[str], progress: _Progress,
           cancel: threading.Event, outcome: dict[str, Any]) -> None:
    targets, config = run.targets, run.config
    key = None
    try:
        where = _direct(targets)
        if config.get("route") == "gateway":
            key = _check_key(run)
            where = _through_gateway(targets, key.secret)
        candidate = targets["candidate"]
        outcome["result"] = asyncio.run(verify(
            prompts=prompts, max_tokens=config["max_tokens"], threshold=config["threshold"],
            on_prompt=progress.add, cancelled=cancel.is_set,
            a_build=candidate.get("engine_source") or None,
            a_algorithm=str(candidate.get("algorithm") or ""), **where))
    except VerifyCancelled:
        outcome["cancelled"] = True
    except VerifyError as exc:  # an engine that cannot be reached or answers wrong: said
        outcome["error"] = _named(str(exc), targets)
    except ApiKeyError as exc:
        outcome["error"] = f"the check could not make its gateway key: {exc}"
    except Exception:  # recorded on the row: the check failed, the worker goes on
        outcome["error"] = traceback.format_exc()
    finally:
        if key is not None:
            apikey_revoke(prefix=key.key.prefix)


def _direct(targets: dict[str, Any]) -> dict[str, Any]:
    return {"a_url": targets["candidate"]["engine_url"].rstrip("/"),
            "b_url": targets["baseline"]["engine_url"].rstrip("/"), "api": "sglang"}


def _check_key(run: VerificationRun) -> Any:
    """A key of the check's own, for the user who started it, scoped to the two deployments:
    its secret lives in this process only (never on the row, in an event or an answer); the
    keys page lists it, with its usage, revoked once the check ends."""
    if run.created_by is None:
        raise ApiKeyError("owner", "the user who started the check is gone")
    return apikey_create(owner_username=run.created_by.get_username(),
                         name=f"losslessness check #{run.pk}",
                         deployment_ids=[run.targets[r]["id"] for r in ("candidate", "baseline")])


def _through_gateway(targets: dict[str, Any], secret: str) -> dict[str, Any]:
    return {"a_url": settings.GATEWAY_URL, "b_url": settings.GATEWAY_URL, "api": "openai",
            "api_key": secret, "a_model": _served(targets["candidate"]),
            "b_model": _served(targets["baseline"])}


def _served(target: dict[str, Any]) -> str:
    return str(target["served_model"])


def _named(message: str, targets: dict[str, Any]) -> str:
    """VerifyError speaks of --a and --b and URLs; the panel's words are the deployments."""
    for role, flag in (("candidate", "--a"), ("baseline", "--b")):
        target = targets[role]
        message = message.replace(f"{flag} ", f"the {role} ").replace(
            target["engine_url"].rstrip("/"), f"{target['name']} ({target['engine_url']})")
    return message


def _finish(run_id: int, status: str, **fields: Any) -> None:
    run_finish(VerificationRun, run_id, status, **fields)


def _record(run: VerificationRun, outcome: dict[str, Any], progress: _Progress) -> str:
    if outcome.get("cancelled"):
        _finish(run.pk, BenchmarkStatus.CANCELLED, progress=progress.snapshot())
        return "cancelled"
    if "error" in outcome:
        _finish(run.pk, BenchmarkStatus.FAILED, progress=progress.snapshot(),
                error=outcome["error"][-4000:])
        return "failed"
    results = outcome["result"].to_dict()
    results.update(candidate=run.targets["candidate"]["name"],
                   baseline=run.targets["baseline"]["name"])
    _finish(run.pk, BenchmarkStatus.DONE, results=results, progress=progress.snapshot())
    return "done"
