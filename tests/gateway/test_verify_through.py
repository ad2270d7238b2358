"""`appliance verify` through the gateway (the panel under uvicorn, a key made by the service):
two ready deployments whose engines are stand-in OpenAI servers that are not SGLang
(tests/openai_standin.py), A speculative, B its baseline, reached as a client
reaches them, by served model name with the key. Identical passes, a near-tie passes, a clear
margin fails at its token; the key is never printed and each call is counted against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.benchmarks.pair import FIB, FOX, baseline_spec, speculative_spec
from tests.conftest_docker import FAST_ENV, TEST_LABELS, host_port, wait_for
from tests.openai_standin import GAP, NEAR_TIE, standin
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.models import ApiKeyUsage

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("The quick brown fox", "def fibonacci(n):\n    ")


def deployment(name: str, url: str, algorithm: str) -> Deployment:
    data = spec(name=name, engine__served_model_name=name)
    return Deployment.objects.create(name=name, spec=data, recipe=data["recipe"],
                                     algorithm=algorithm, gpus=data["gpus"],
                                     status=DeploymentStatus.READY, engine_url=url)


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SD_API_KEY"}
    return subprocess.run([sys.executable, "-m", "appliance.cli", "verify", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**environ, **(env or {})})


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def test_verify_through_the_gateway_passes_identical_and_near_ties_and_fails_a_margin(
        panel: str, operator: Any, key_for: Callable[..., str], prompts: Path) -> None:
    cases = {"same": {}, "tie": {"near_ties": frozenset({5}), "diverge_at": 5},
             "margin": {"diverge_at": 7}}
    with ExitStack() as stack:
        made = []
        for case, planted in cases.items():
            ties = planted.get("near_ties", frozenset())
            a = stack.enter_context(standin(model=f"{case}-spec", logprobs=False, **planted))
            b = stack.enter_context(standin(model=f"{case}-base", near_ties=ties))
            made += [deployment(f"{case}-spec", a.url, "DDTREE"),
                     deployment(f"{case}-base", b.url, "NONE")]
        secret = key_for(operator, deployments=made)
        done = {case: verify("--a", panel, "--b", panel, "--a-model", f"{case}-spec",
                             "--b-model", f"{case}-base", "--prompts", str(prompts),
                             "--max-tokens", "10", "--json", env={"SD_API_KEY": secret})
                for case in cases}
        text = verify("--a", panel, "--b", panel, "--a-model", "margin-spec", "--b-model",
                      "margin-base", "--prompts", str(prompts), "--max-tokens", "10",
                      "--api-key", secret)
    assert [done[c].returncode for c in cases] == [0, 0, 1], {c: d.stderr for c, d in done.items()}
    same, tie, margin = (json.loads(done[c].stdout) for c in cases)
    assert (same["api"], same["identical"], same["failures"]) == ("completions", 2, 0)
    assert same["models"] == {"a": "same-spec", "b": "same-base"}
    assert "does not support return_logprob" in same["a_logprobs"]  # the engine's words
    assert [(p["verdict"], p["position"], p["gap"]) for p in tie["prompts"]] == [
        ("near-tie", 5, NEAR_TIE)] * 2
    assert [(p["verdict"], p["position"], p["gap"]) for p in margin["prompts"]] == [
        ("failure", 7, GAP)] * 2
    assert text.returncode == 1
    assert "  1 failure   at token 7, B's top-2 gap 2.0000: 'The quick brown fox'" in text.stdout
    for result in (*done.values(), text):
        assert secret not in result.stdout + result.stderr
    # Every call of every run went through the gateway on the key: one request per prompt
    # and side. A's first ask for log-probs is refused by the gateway itself (a DDTREE
    # deployment without a companion, appliance/engine/refusals.py): no engine work, no usage.
    usage = {u.deployment.name: u.requests for u in ApiKeyUsage.objects.select_related(
        "deployment")}
    assert usage == {"same-base": 2, "tie-base": 2, "margin-base": 4,
                     "same-spec": 2, "tie-spec": 2, "margin-spec": 4}


def test_verify_through_the_gateway_without_a_key_says_how_to_give_one(
        panel: str, prompts: Path) -> None:
    done = verify("--a", panel, "--b", panel, "--model", "any", "--prompts", str(prompts))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--a {panel}/v1/models refused the call (HTTP 401" in done.stderr
    assert "give the gateway's API key with --api-key or $SD_API_KEY" in done.stderr


@pytest.mark.docker
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_verify_through_the_gateway_finds_the_test_engines_planted_divergences(
        panel: str, operator: Any, key_for: Callable[..., str], docker_client: Any,
        test_engine_image: str, tmp_path: Path, endpoint: str) -> None:
    """The test engine (docker/test-engine) as the product launches it, from the check's own
    spec pair (tests/benchmarks/pair.py): a failure at token 5 of the fibonacci prompt, a
    near-tie at token 12 of the fox prompt."""
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (FIB, FOX, "A B C")))
    with ExitStack() as stack:
        rows = []
        for data, algorithm in ((speculative_spec(), "DDTREE"), (baseline_spec(), "NONE")):
            plan = launch_args(spec_from_dict(data))
            container = docker_client.containers.run(
                test_engine_image, command=plan.argv, detach=True,
                environment={**FAST_ENV, **plan.env}, labels=dict(TEST_LABELS),
                ports={"30000/tcp": ("127.0.0.1", None)})
            stack.callback(container.remove, force=True)
            url = f"http://127.0.0.1:{host_port(container)}"
            wait_for(lambda url=url: _healthy(url), 90, 0.2)
            rows.append(Deployment.objects.create(
                name=data["name"], spec=data, recipe=data["recipe"], algorithm=algorithm,
                gpus=data["gpus"], status=DeploymentStatus.READY, engine_url=url))
        secret = key_for(operator, deployments=rows)
        done = verify("--a", panel, "--b", panel, "--a-model", "spec", "--b-model", "base",
                      "--endpoint", endpoint, "--prompts", str(path), "--max-tokens", "16",
                      "--json", env={"SD_API_KEY": secret})
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert (result["api"], result["models"]) == (endpoint, {"a": "spec", "b": "base"})
    fib, fox, plain = result["prompts"]
    assert (fib["verdict"], fib["position"]) == ("failure", 5) and fib["gap"] >= 1.5
    assert (fox["verdict"], fox["position"], fox["gap"]) == ("near-tie", 12, 0.0625)
    assert plain["verdict"] == "identical"
    assert "does not support return_logprob" in result["a_logprobs"]
    assert secret not in done.stdout + done.stderr


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False
