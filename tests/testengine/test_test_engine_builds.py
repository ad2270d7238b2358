"""The simulator refuses what the build it imitates refuses (TEST_ENGINE_BUILD), from the
appliance's per-build table (appliance/engine/refusals.py, held to the real engine's
recordings by tests/appliance/engine/test_refusals.py), never from the algorithm's name:
a build recorded serving log-probs under an algorithm serves them in the simulator too, one
recorded refusing refuses with its recorded message. The test engine runs as a process of
this machine (no Docker); tests/testengine/test_test_engine_refusals.py replays every
recorded refusal request against the image."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import requests

from appliance.engine import refusals as table
from tests.testengine.test_recorded_speculation import ENGINE_DIR, local_engine

sys.path.insert(0, str(ENGINE_DIR))
from sglang.test_engine import refusals as simulated  # noqa: E402

CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
LOGPROBS = {"logprobs": True, "top_logprobs": 2}
GRAMMAR = {"response_format": {"type": "json_object"}}
# Every (build, algorithm) the table has: each launched as that build imitates it.
CASES = [(source, algorithm) for source, build in sorted(table.BUILDS.items())
         for algorithm in sorted(build.refused)]


def _argv(algorithm: str) -> list[str]:
    if algorithm == "NONE":
        return []
    argv = ["--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", "8"]
    return argv + (["--speculative-ddtree-budget", "16"] if algorithm == "DDTREE" else [])


def test_the_copy_shipped_with_the_engine_is_the_appliances_table() -> None:
    assert simulated.table() == table.table(), (
        "docker/test-engine/sglang/test_engine/refusals.json differs from "
        "appliance/engine/refusals.py: write it with `python3 -m appliance.engine.refusals "
        "write docker/test-engine/sglang/test_engine/refusals.json` and rebuild the image")


def test_the_table_has_a_build_that_refuses_log_probs_and_one_that_serves_them() -> None:
    """The cases below cover both answers (else the test could not fail either way)."""
    needs = [table.BUILDS[s].needs(a) or {} for s, a in CASES if a != "NONE"]
    assert any(table.LOGPROBS in n for n in needs)
    assert any(table.LOGPROBS not in n for n in needs)


def _message(response: requests.Response) -> str | None:
    if response.status_code == 200:
        return None
    body: dict[str, Any] = response.json()
    return str(body.get("message") or (body.get("error") or {}).get("message"))


@pytest.mark.parametrize("source,algorithm", CASES, ids=[f"{s}-{a}" for s, a in CASES])
def test_the_engine_refuses_what_its_build_refuses_and_serves_the_rest(
        source: str, algorithm: str) -> None:
    refused = table.BUILDS[source].needs(algorithm) or {}
    with local_engine(*_argv(algorithm), TEST_ENGINE_BUILD=source) as (url, log):
        info = requests.get(url + "/server_info", timeout=10).json()
        chat = requests.post(url + "/v1/chat/completions", json={**CHAT, **LOGPROBS},
                             timeout=30)
        completion = requests.post(url + "/v1/completions", timeout=30, json={
            "model": "m", "prompt": "hello", "max_tokens": 4, "logprobs": 2})
        native = requests.post(url + "/generate", timeout=30, json={
            "text": "hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 2})
        grammar = requests.post(url + "/v1/chat/completions", json={**CHAT, **GRAMMAR},
                                timeout=30)
        said = log.read_text()
    assert info["simulator_refusals"]["build"] == source
    assert info["simulator_refusals"]["refused"] == {n: m for n, (_, m) in refused.items()}
    assert f"as {table.BUILDS[source].title} does" in said
    if table.LOGPROBS in refused:
        message = refused[table.LOGPROBS][1]
        assert [r.status_code for r in (chat, completion, native)] == [400, 400, 400]
        assert [_message(r) for r in (chat, completion, native)] == [message] * 3
    else:
        assert [r.status_code for r in (chat, completion, native)] == [200, 200, 200], \
            (chat.text, completion.text, native.text)
        assert chat.json()["choices"][0]["logprobs"]["content"]
        assert len(completion.json()["choices"][0]["logprobs"]["tokens"]) == 4
        assert len(native.json()["meta_info"]["output_token_logprobs"]) == 4
    if table.GRAMMAR in refused:
        assert (grammar.status_code, _message(grammar)) == (400, refused[table.GRAMMAR][1])
    else:
        assert grammar.status_code == 200, grammar.text


@pytest.mark.parametrize("build,algorithm,says", [
    ("0.4.0", "DFLASH", "TEST_ENGINE_BUILD=0.4.0: no such build in the refusal table "
                        "(refusals.json, from appliance/engine/refusals.py); one of 0.5.23, "
                        "433c58ed7"),
    ("0.5.23", "DDTREE", "TEST_ENGINE_BUILD=0.5.23: SGLang 0.5.23 (PyPI) has no DDTREE (it "
                         "has DFLASH, NONE)")])
def test_a_build_the_table_cannot_answer_for_stops_the_launch(build: str, algorithm: str,
                                                              says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/test",
         "--port", "1", *_argv(algorithm)], cwd=ENGINE_DIR, capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(ENGINE_DIR),
                         "TEST_ENGINE_BUILD": build})
    assert done.returncode == 2, done.stderr
    assert says in done.stderr, done.stderr

