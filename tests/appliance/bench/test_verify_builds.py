"""Whether the losslessness check asks the speculative server (A) for log-probs is its engine
build's, from the per-build refusal table (appliance/engine/refusals.py), never the
algorithm's name: a build that refuses them (433c58ed7 under DDTREE, recorded) is not asked,
its tokens are read from its text and the result says so; a build that serves them (0.5.23
under DFLASH) is asked and its own tokens are compared. Against stand-in OpenAI servers
(tests/openai_standin.py), A with a divergence at a clear margin at token 6."""

from __future__ import annotations

import asyncio
from typing import Any

from appliance.bench.verify import VerifyResult, a_logprobs_plan, verify
from appliance.engine import refusals
from tests.openai_standin import GAP, standin

PROMPTS = ["The quick brown fox", "1, 1, 2, 3,"]


def _check(a_url: str, b_url: str, **build: Any) -> VerifyResult:
    return asyncio.run(verify(a_url=a_url, b_url=b_url, prompts=PROMPTS, max_tokens=10,
                              threshold=0.5, api="openai", **build))


def test_the_plan_is_the_tables_for_each_build() -> None:
    ddtree = a_logprobs_plan("433c58ed7", "DDTREE")
    assert (ddtree["logprobs"], ddtree["assumed"], ddtree["basis"]) == (
        "refused", False, refusals.RECORDED)
    assert ddtree["message"] == refusals.LOGPROBS_MESSAGE
    dflash = a_logprobs_plan("0.5.23", "DFLASH")
    assert (dflash["logprobs"], dflash["message"]) == ("served", "")
    assert dflash["title"] == refusals.BUILDS["0.5.23"].title
    unknown = a_logprobs_plan("deadbeef0", "dflash")
    assert (unknown["logprobs"], unknown["assumed"], unknown["algorithm"]) == (
        "refused", True, "DFLASH")


def test_a_build_that_refuses_log_probs_is_not_asked_and_the_result_says_so() -> None:
    # A would serve them (a stand-in): the table, not A's answer, decides.
    with standin(diverge_at=6) as a, standin() as b:
        result = _check(a.url, b.url, a_build="433c58ed7", a_algorithm="DDTREE")
    assert a.seen and not any(body.get("logprobs") for body in a.seen)
    assert all(body.get("logprobs") for body in b.seen)
    assert result.compared == ("token texts (A's tokens read from its text: its engine build "
                               "refuses log-probs, so none were asked)")
    assert result.a_logprobs.startswith("not asked: SGLang 433c58ed7")
    assert refusals.LOGPROBS_MESSAGE in result.a_logprobs  # the recorded answer, named
    assert result.a_engine["logprobs"] == "refused"
    assert any("A was not asked for log-probs" in note for note in result.notes)
    # Read from its text, A's divergence is still found at its token, judged by B's gap.
    assert [(p.verdict, p.position, p.gap) for p in result.prompts] == [
        ("failure", 6, GAP)] * 2


def test_a_build_that_serves_log_probs_is_asked_and_its_own_tokens_compared() -> None:
    with standin(diverge_at=6) as a, standin() as b:
        result = _check(a.url, b.url, a_build="0.5.23", a_algorithm="DFLASH")
    assert a.seen and all(body.get("logprobs") for body in a.seen)
    assert (result.compared, result.a_logprobs) == ("token texts", "given")
    assert result.a_engine["logprobs"] == "served" and result.notes == []
    assert [(p.verdict, p.position, p.gap) for p in result.prompts] == [
        ("failure", 6, GAP)] * 2


def test_a_build_the_table_says_serves_but_refuses_is_said_to_contradict_it() -> None:
    with standin(diverge_at=6, logprobs=False) as a, standin() as b:
        result = _check(a.url, b.url, a_build="0.5.23", a_algorithm="DFLASH")
    assert a.seen[0].get("logprobs") and not any(body.get("logprobs") for body in a.seen[1:])
    assert "does not support return_logprob" in result.a_logprobs  # A's own answer
    assert result.compared == ("token texts (A's tokens read from its text: it gave no "
                               "log-probs)")
    assert any("the table is wrong for this engine" in note for note in result.notes)
    assert [p.verdict for p in result.prompts] == ["failure"] * 2


def test_without_a_build_a_is_asked_until_it_first_refuses() -> None:
    with standin(diverge_at=6, logprobs=False) as a, standin() as b:
        result = _check(a.url, b.url)
    assert [bool(body.get("logprobs")) for body in a.seen] == [True, False, False]
    assert result.a_engine == {} and result.notes == []
