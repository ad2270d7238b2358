"""`appliance verify` (a real subprocess) against test engine containers: a DDTREE engine
with divergences planted by TEST_ENGINE_DIVERGE (docker/test-engine/sglang/test_engine/
logits.py) and a baseline without speculation of the same simulated model. Each planted
divergence is reported at its token with its class, and the exit code follows: 0 identical
or near-ties only, 1 a divergence at a clear margin, 2 a usage error."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docker.errors
import pytest
import requests
from docker.client import DockerClient
from docker.models.containers import Container

from appliance.bench.verify import shipped_prompts
from tests.conftest_docker import (  # noqa: F401
    FAST_ENV,
    TEST_LABELS,
    docker_client,
    host_port,
    test_engine_image,
    wait_for,
)

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[3]
FIB, FOX = shipped_prompts()[2], shipped_prompts()[0]  # "def fibonacci(n):", "The quick brown fox"
PLANTED = "margin:5@def fibonacci,near-tie:12@quick brown"


def _argv(*speculative: str) -> list[str]:
    return ["python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.6",
            "--host", "0.0.0.0", "--port", "30000", *speculative]


DDTREE = ("--speculative-algorithm", "DDTREE", "--speculative-num-draft-tokens", "8",
          "--speculative-ddtree-budget", "32")


@pytest.fixture(scope="module")
def engines(docker_client: DockerClient, test_engine_image: str  # noqa: F811
            ) -> Iterator[Callable[..., str]]:
    """Start a test engine (argv, env) once per module and give its base URL."""
    started: dict[tuple[tuple[str, ...], str], tuple[Container, str]] = {}

    def start(*speculative: str, diverge: str = "") -> str:
        key = (speculative, diverge)
        if key not in started:
            env = {**FAST_ENV, "TEST_ENGINE_DIVERGE": diverge} if diverge else dict(FAST_ENV)
            container = docker_client.containers.run(
                test_engine_image, command=_argv(*speculative), detach=True, environment=env,
                labels=dict(TEST_LABELS), ports={"30000/tcp": ("127.0.0.1", None)})
            url = f"http://127.0.0.1:{host_port(container)}"
            started[key] = (container, url)
            wait_for(lambda: _healthy(url), 60, 0.2)
        return started[key][1]

    yield start
    for container, _ in started.values():
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", "verify", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=180)


def _by_prompt(done: subprocess.CompletedProcess[str]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {p["prompt"]: p for p in json.loads(done.stdout)["prompts"]}


def test_an_engine_with_nothing_planted_matches_its_baseline_on_every_built_in_prompt(
        engines) -> None:  # type: ignore[no-untyped-def]
    done = verify("--a", engines(*DDTREE), "--b", engines(), "--json", "--max-tokens", "24")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["total"], result["identical"], result["near_ties"], result["failures"]) == (
        36, 36, 0, 0)
    assert result["match_rate"] == 1.0 and "does not support return_logprob" in result["a_logprobs"]


def test_the_planted_margin_fails_at_its_token_and_the_near_tie_passes_at_its_own(
        engines) -> None:  # type: ignore[no-untyped-def]
    done = verify("--a", engines(*DDTREE, diverge=PLANTED), "--b", engines(), "--json",
                  "--max-tokens", "24")
    assert done.returncode == 1, done.stderr
    result, prompts = json.loads(done.stdout), _by_prompt(done)
    fib, fox = prompts[FIB], prompts[FOX]
    assert (fib["verdict"], fib["position"], fib["candidate_in_top2"]) == ("failure", 5, True)
    assert fib["gap"] >= 1.5  # the simulated model's clear margins
    assert (fox["verdict"], fox["position"], fox["gap"]) == ("near-tie", 12, 0.0625)
    for side in ("a", "b"):  # B's per-token texts: both continuations start at the token
        assert fib[side]["text_from"] == "token" and fib[side]["token_text"]
        assert fib[side]["text"].startswith(fib[side]["token_text"])
    assert fib["a"]["ids"][0] != fib["b"]["ids"][0]
    assert (result["identical"], result["near_ties"], result["failures"]) == (34, 1, 1)
    assert all(p["verdict"] == "identical" for p in prompts.values() if p not in (fib, fox))


def test_a_near_tie_alone_passes_and_fails_under_a_threshold_below_its_gap(
        engines, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = engines(*DDTREE, diverge="near-tie:12@quick brown"), engines()
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"prompt": FOX}) + "\n" + json.dumps({"prompt": FIB}) + "\n")
    done = verify("--a", a, "--b", b, "--prompts", str(path), "--max-tokens", "16")
    assert done.returncode == 0, done.stderr
    assert "  1 near-tie  at token 12, B's top-2 gap 0.0625" in done.stdout
    assert "match rate 1/2, near-ties 1, failures 0 (threshold 0.5)" in done.stdout
    done = verify("--a", a, "--b", b, "--prompts", str(path), "--max-tokens", "16",
                  "--threshold", "0.01")
    assert done.returncode == 1
    assert "  1 failure   at token 12, B's top-2 gap 0.0625" in done.stdout


def test_a_divergence_past_the_answer_is_not_seen_and_a_speculative_baseline_is_refused(
        engines) -> None:  # type: ignore[no-untyped-def]
    a = engines(*DDTREE, diverge=PLANTED)
    done = verify("--a", a, "--b", engines(), "--max-tokens", "5", "--json")
    assert done.returncode == 0, done.stderr  # token 5 is the sixth: past five tokens
    assert json.loads(done.stdout)["identical"] == 36
    done = verify("--a", a, "--b", engines(*DDTREE))
    assert done.returncode == 2
    assert "give a server without speculation as --b" in done.stderr


def test_a_baseline_answer_has_the_shape_the_real_baseline_recorded(engines) -> None:  # type: ignore[no-untyped-def]
    recorded = json.loads((ROOT / "tests/fixtures/real-engine/433c58ed7/base_triton/probe.json")
                          .read_text())[0]["response"]
    body = {"text": FOX, "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            "return_logprob": True, "top_logprobs_num": 2}
    answer = requests.post(f"{engines()}/generate", json=body, timeout=10).json()
    assert set(answer) == set(recorded) == {"text", "output_ids", "meta_info"}
    shared = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
              "finish_reason", "prompt_tokens", "completion_tokens", "e2e_latency")
    assert all(k in answer["meta_info"] and k in recorded["meta_info"] for k in shared)
    tokens, tops = answer["meta_info"]["output_token_logprobs"], answer["meta_info"][
        "output_top_logprobs"]
    assert [t[1] for t in tokens] == answer["output_ids"] and len(tops) == 8
    assert all(len(top) == 2 and top[0][0] > top[1][0] and top[0][2] is None for top in tops)
    five = requests.post(f"{engines()}/generate", json={**body, "top_logprobs_num": 5},
                         timeout=10).json()["meta_info"]["output_top_logprobs"]
    assert all(len(top) == 5 and [e[0] for e in top] == sorted((e[0] for e in top), reverse=True)
               and len({e[1] for e in top}) == 5 for top in five)  # as verify asks (TOP_LOGPROBS)
    refused = requests.post(f"{engines(*DDTREE)}/generate", json=body, timeout=10)
    assert refused.status_code == 400
    assert refused.json() == {"error": {"message": "DFLASH speculative decoding does not "
                                        "support return_logprob yet."}}


def test_a_planted_near_tie_off_the_models_near_ties_stops_the_engine_saying_where_they_are(
        docker_client: DockerClient, test_engine_image: str) -> None:  # noqa: F811
    with pytest.raises(docker.errors.ContainerError) as stopped:
        docker_client.containers.run(
            test_engine_image, command=_argv(*DDTREE), remove=True, labels=dict(TEST_LABELS),
            environment={**FAST_ENV, "TEST_ENGINE_DIVERGE": "near-tie:13"})
    assert stopped.value.exit_status == 2
    said = stopped.value.stderr.decode()
    assert "'near-tie:13': token 13 is not one of the model's near-ties" in said
    assert "(tokens p with p % 8 == 4: 4, 12, 20, ...)" in said


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_over_openai_the_planted_divergences_are_found_where_generate_finds_them(
        engines, tmp_path: Path, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    a, b = engines(*DDTREE, diverge=PLANTED), engines()
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (FIB, FOX, "A B C")))
    native = verify("--a", a, "--b", b, "--prompts", str(path), "--max-tokens", "16",
                    "--json")
    openai = verify("--a", a, "--b", b, "--prompts", str(path), "--max-tokens", "16",
                    "--json", "--api", "openai", "--endpoint", endpoint)
    assert native.returncode == openai.returncode == 1, native.stderr + openai.stderr
    by_ids, by_texts = json.loads(native.stdout), json.loads(openai.stdout)
    assert (by_ids["api"], by_ids["compared"]) == ("sglang", "token ids")
    assert by_texts["api"] == endpoint and by_texts["compared"].startswith("token texts (A's")
    assert by_texts["models"] == {"a": "/models/Kimi-K2.6", "b": "/models/Kimi-K2.6"}
    assert "does not support return_logprob" in by_texts["a_logprobs"]
    assert [(p["verdict"], p["position"]) for p in by_texts["prompts"]] == [
        (p["verdict"], p["position"]) for p in by_ids["prompts"]] == [
        ("failure", 5), ("near-tie", 12), ("identical", None)]
    fib, fox = by_texts["prompts"][:2]
    assert fox["gap"] == 0.0625 and fib["gap"] >= 1.5
    if endpoint == "completions":  # the same context as /generate's: the same tokens
        assert fib["gap"] == by_ids["prompts"][0]["gap"]
        assert fib["b"]["ids"][0] == fib["b"]["token_text"] == by_ids["prompts"][0]["b"][
            "token_text"]
        assert fib["a"]["ids"][0] == by_ids["prompts"][0]["a"]["token_text"]
    # (A chat's context is its messages, so its tokens are others.)
