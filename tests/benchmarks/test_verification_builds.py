"""The panel's losslessness check asks the refusal table for the candidate's engine build
(its recipe's SGLang source, appliance/engine/refusals.py) whether to ask it for log-probs:
a DDTREE deployment on 433c58ed7 (recorded refusing them) is not asked and the result says
its tokens were compared without them; a DFLASH deployment on 0.5.23 (serving them) is
asked and gives them. The engines are the test engine as processes of this machine
imitating each build (TEST_ENGINE_BUILD), real PostgreSQL; the task's body runs here."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.engine import refusals
from tests.specs import spec
from tests.testengine.test_recorded_speculation import local_engine
from web.benchmarks import verification_services
from web.benchmarks.models import VerificationRun
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)
PROMPTS = '{"prompt": "The quick brown fox"}\n{"prompt": "1, 1, 2, 3,"}\n'


def _deployment(name: str, url: str, *, recipe: str, algorithm: str) -> Deployment:
    data = spec(name=name, recipe=recipe, engine__speculative_algorithm=algorithm)
    if algorithm == "NONE":
        data["engine"] = {"model_path": data["engine"]["model_path"], "tp_size": 1}
    return Deployment.objects.create(name=name, spec=data, recipe=recipe, algorithm=algorithm,
                                     gpus=data["gpus"], status=DeploymentStatus.READY,
                                     engine_url=url)


def _argv(algorithm: str) -> list[str]:
    argv = ["--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", "8"]
    return argv + (["--speculative-ddtree-budget", "16"] if algorithm == "DDTREE" else [])


@pytest.mark.parametrize("recipe,algorithm,build", [
    ("kimi-k2.6-ddtree", "DDTREE", "433c58ed7"), ("kimi-k2.6-dflash", "DFLASH", "0.5.23")])
def test_the_check_asks_the_candidate_for_log_probs_as_its_build_answers_them(
        monkeypatch: Any, recipe: str, algorithm: str, build: str) -> None:
    monkeypatch.setattr(verification_services.tasks, "verification_run_later",
                        lambda run_id: None)  # the task's body runs below, in this process
    serves = refusals.LOGPROBS not in (refusals.BUILDS[build].needs(algorithm) or {})
    with local_engine(*_argv(algorithm), TEST_ENGINE_BUILD=build) as (a_url, _), \
            local_engine(TEST_ENGINE_BUILD=build) as (b_url, _):
        candidate = _deployment("spec", a_url, recipe=recipe, algorithm=algorithm)
        baseline = _deployment("base", b_url, recipe="kimi-k2.6-baseline", algorithm="NONE")
        run = verification_services.verification_create(
            candidate_id=candidate.pk, baseline_id=baseline.pk, prompt_source="jsonl",
            prompts_text=PROMPTS, max_tokens=12)
        assert run.targets["candidate"]["engine_source"] == build
        assert verification_services.verification_run(run_id=run.pk) == "done"
    results = VerificationRun.objects.get(pk=run.pk).results
    assert results["a_engine"]["build"] == build
    assert results["a_engine"]["logprobs"] == ("served" if serves else "refused")
    assert (results["total"], results["identical"], results["passed"]) == (2, 2, True)
    assert results["compared"] == "token ids"  # /generate gives ids with or without them
    if serves:
        assert results["a_logprobs"] == "given" and results["notes"] == []
    else:
        assert results["a_logprobs"].startswith(f"not asked: SGLang {build}")
        assert refusals.LOGPROBS_MESSAGE in results["a_logprobs"]
        assert [n for n in results["notes"] if n.startswith("A was not asked for log-probs")]
