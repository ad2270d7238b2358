"""`appliance verify` (a real subprocess) against stand-in OpenAI servers that are not SGLang
(tests/openai_standin.py: only /v1/models, /v1/completions, /v1/chat/completions):
the API found from /v1/models, the tokens compared by their texts, a near-tie passed and a
divergence at a clear margin failed at its token, on both endpoints, with and without A's
log-probs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from appliance.bench.lossless import TOP_LOGPROBS
from appliance.bench.verify import by_text, compare
from tests.openai_standin import GAP, MODEL, NEAR_TIE, answer_steps, standin

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ("The quick brown fox", "def fibonacci(n):\n    ", "Dear operator,")


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", "verify", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_two_identical_openai_servers_pass_comparing_token_texts(prompts: Path,
                                                                endpoint: str) -> None:
    with standin() as a, standin() as b:
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--endpoint",
                      endpoint, "--max-tokens", "16", "--json")
    assert done.returncode == 0, done.stderr
    result = result_of(done)
    assert (result["api"], result["compared"], result["models"]) == (
        endpoint, "token texts", {"a": MODEL, "b": MODEL})
    assert (result["identical"], result["near_ties"], result["failures"]) == (3, 0, 0)
    assert result["a_logprobs"] == "given"
    for body in b.seen:
        assert body["temperature"] == 0 and body["max_tokens"] == 16 and body["ignore_eos"]
        if endpoint == "chat":
            assert body["logprobs"] is True and body["top_logprobs"] == TOP_LOGPROBS
            assert body["messages"][0]["role"] == "user"
        else:
            assert body["logprobs"] == TOP_LOGPROBS and body["prompt"] in PROMPTS


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("a_logprobs", [True, False])
def test_a_near_tie_passes_and_a_clear_margin_fails_at_its_token(
        prompts: Path, endpoint: str, a_logprobs: bool) -> None:
    ties = frozenset({6})
    with standin(near_ties=ties, diverge_at=6, logprobs=a_logprobs) as a, \
            standin(near_ties=ties) as b:
        tie = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--endpoint",
                     endpoint, "--max-tokens", "12", "--json")
    with standin(diverge_at=9, logprobs=a_logprobs) as a, standin() as b:
        margin = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--endpoint",
                        endpoint, "--max-tokens", "12", "--json")
    assert tie.returncode == 0, tie.stderr
    assert margin.returncode == 1, margin.stderr
    for p in result_of(tie)["prompts"]:
        assert (p["verdict"], p["position"], p["gap"]) == ("near-tie", 6, NEAR_TIE), p
        assert p["candidate_in_top2"] is True and p["candidate_gap"] == NEAR_TIE
    for p in result_of(margin)["prompts"]:
        assert (p["verdict"], p["position"], p["gap"]) == ("failure", 9, GAP), p
        # Each side's token there is the model's: B its first choice, A its second.
        prompt = (json.dumps([{"role": "user", "content": p["prompt"]}]) if endpoint == "chat"
                  else p["prompt"])
        steps = answer_steps(prompt, 12, frozenset(), None)
        assert p["b"]["ids"][0] == p["b"]["token_text"] == steps[9][0]
        assert p["a"]["ids"][0] == p["a"]["token_text"] == steps[9][1][1][0]
        assert p["a"]["text_from"] == "token" and p["a"]["text"].startswith(p["a"]["ids"][0])
    compared = result_of(margin)["compared"]
    if a_logprobs:
        assert compared == "token texts" and result_of(margin)["a_logprobs"] == "given"
    else:
        assert compared.startswith("token texts (A's tokens read from its text")
        assert "does not support return_logprob" in result_of(margin)["a_logprobs"]


def test_the_text_report_names_the_api_the_models_and_each_divergent_token(
        prompts: Path) -> None:
    with standin(diverge_at=3, logprobs=False) as a, standin() as b:
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts),
                      "--max-tokens", "8")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == (f"OpenAI /v1/completions, A model {MODEL!r}, B model {MODEL!r}; "
                        "compared: token texts (A's tokens read from its text: it gave no "
                        "log-probs)")
    assert lines[1].startswith("A gives no log-probs (HTTP 400: ")
    assert f"  1 failure   at token 3, B's top-2 gap {GAP:.4f}: 'The quick brown fox'" in lines
    assert sum(line.startswith("      A: tokens [") for line in lines) == 3
    assert lines[-1] == "match rate 0/3, near-ties 0, failures 3 (threshold 0.5)"
    # Asked for log-probs once; refused, A was asked without them from then on.
    assert [bool(s.get("logprobs")) for s in a.seen] == [True, False, False, False]


def test_the_api_key_comes_from_the_flag_or_the_environment_and_a_missing_one_is_named(
        prompts: Path) -> None:
    with standin(api_key="sk-test-1") as a, standin(api_key="sk-test-1") as b:
        refused = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts))
        flag = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--api-key",
                      "sk-test-1")
        env = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts),
                     env={"SD_API_KEY": "sk-test-1"})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"--a {a.url}/v1/models refused the call (HTTP 401" in refused.stderr
    assert "give the gateway's API key with --api-key or $SD_API_KEY" in refused.stderr
    assert flag.returncode == env.returncode == 0, flag.stderr + env.stderr
    assert set(b.auth[-4:]) == {"Bearer sk-test-1"}
    assert "sk-test-1" not in flag.stdout + env.stdout  # the key is never printed


def test_a_strict_server_that_refuses_ignore_eos_is_asked_without_it(prompts: Path) -> None:
    with standin(strict=True) as a, standin(strict=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--json")
    assert done.returncode == 0, done.stderr
    result = result_of(done)
    assert result["identical"] == 3
    assert result["notes"] == [f"--a {a.url} refused ignore_eos: its answers end at its EOS",
                               f"--b {b.url} refused ignore_eos: its answers end at its EOS"]
    assert "ignore_eos" in a.seen[0] and all("ignore_eos" not in s for s in a.seen[1:])


def test_the_model_is_chosen_by_flag_and_a_wrong_one_or_a_non_server_is_a_usage_error(
        prompts: Path) -> None:
    with standin() as a, standin() as b:
        wrong = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--model", "x")
        right = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--api",
                       "openai", "--a-model", MODEL, "--b-model", MODEL)
        native = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts), "--api",
                        "sglang")
        nowhere = verify("--a", a.url + "/v1", "--b", b.url, "--prompts", str(prompts))
    assert wrong.returncode == 2 and "/v1/completions answered HTTP 404" in wrong.stderr
    assert right.returncode == 0, right.stderr
    assert native.returncode == 2 and "/generate answered HTTP 404" in native.stderr
    assert nowhere.returncode == 2
    assert "answers neither SGLang's /model_info nor /v1/models" in nowhere.stderr
    assert "Traceback" not in wrong.stderr + native.stderr + nowhere.stderr


def test_a_baseline_that_refuses_logprobs_over_openai_is_a_usage_error(prompts: Path) -> None:
    with standin() as a, standin(logprobs=False) as b:
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(prompts))
    assert done.returncode == 2
    assert "refuses log-probs" in done.stderr
    assert "give a server without speculation as --b" in done.stderr


def _baseline(tokens: list[str], tops: list[list[tuple[str, float]]]) -> dict[str, Any]:
    """B's answer in /generate's shape, as appliance.bench.verify_api makes of a /v1 one."""
    return {"text": "".join(tokens), "output_ids": tokens, "meta_info": {
        "output_token_logprobs": [[-0.1, t, t] for t in tokens],
        "output_top_logprobs": [[[lp, t, t] for t, lp in top] for top in tops]}}


def test_a_text_without_tokens_is_read_against_the_baselines_tokens_and_top_choices() -> None:
    tops = [[(" a", -0.1), (" b", -2.0)], [(" tree", -0.1), (" tr", -0.2), (" x", -3.0)],
            [(" c", -0.1), (" d", -1.0)]]
    b = _baseline([" a", " tree", " c"], tops)

    def read(text: str) -> list[str]:
        return by_text({"text": text, "output_ids": None}, b)["output_ids"]  # type: ignore[no-any-return]

    assert read(" a tree c") == [" a", " tree", " c"]
    assert read(" a x c") == [" a", " x"]  # B's third choice there, whose text A goes on with
    assert read(" a zzz") == [" a", "<not in B's top: ' zzz'...>"]  # none of B's top ones
    assert read(" a") == [" a"]  # A's text ends: its token there is unknown
    assert read(" a tree c!") == [" a", " tree", " c", "<not in B's top: '!'...>"]
    # The limit the report names: B's " tree" read where A wrote " tr" + "ee" (same text).
    assert read(" a tree c") == read(" a" + " tr" + "ee" + " c")


def test_a_text_read_so_is_judged_by_the_baselines_gap_at_the_token_where_it_parts() -> None:
    tops = [[(" a", -0.1), (" b", -2.0)], [(" tree", -0.1), (" tr", -0.1625), (" x", -3.0)],
            [(" c", -0.1), (" d", -1.0)]]
    b = _baseline([" a", " tree", " c"], tops)
    near = compare(1, "p", {"text": " a tr c", "output_ids": None}, b, threshold=0.5)
    far = compare(1, "p", {"text": " a zzz", "output_ids": None}, b, threshold=0.5)
    assert (near.verdict, near.position, near.candidate_in_top2) == ("near-tie", 1, True)
    assert near.a is not None and near.a.token_text == " tr"
    assert (far.verdict, far.position, far.candidate_in_top2) == ("failure", 1, False)
