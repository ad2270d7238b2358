"""The table of what each engine build refuses per speculative mode
(appliance/engine/refusals.py) held to the real engine's answers: every refusals.json of
tests/fixtures/real-engine (the build is the recording's source folder), each request
classified by the table's own reading of it; a build the table holds from a source reading
(0.5.23) is checked against what that reading says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from appliance.engine.refusals import (
    BUILDS,
    GRAMMAR,
    LOGPROBS,
    MANY_CHOICES,
    RECORDED,
    SERVED_BY_ALL,
    SOURCE_READING,
    build_refusals,
    limitation,
    request_needs,
)
from tests.real_engine import ROOT

RECORDINGS = sorted(ROOT.glob("*/*/refusals.json"))


def _mode(run: Path) -> str:
    argv = json.loads((run / "run.json").read_text())["argv"]
    return argv[argv.index("--speculative-algorithm") + 1] if \
        "--speculative-algorithm" in argv else "NONE"


def _refused(answer: dict[str, Any]) -> str | None:
    """The engine's refusal message, or None when it served the request (a stream that
    refuses is a 200 whose event is an error)."""
    body = answer["body"]
    if answer["status"] >= 400:
        return body.get("message") if isinstance(body, dict) else str(body)
    if isinstance(body, str) and body.startswith('data: {"error"'):
        return json.loads(body.split("\n\n")[0].removeprefix("data: "))["error"]["message"]
    return None


def _answers() -> list[tuple[str, str, dict[str, Any]]]:
    """(source, mode, answer): the source is the recording's folder under real-engine/."""
    return [(path.parent.parent.name, _mode(path.parent), answer) for path in RECORDINGS
            for answer in json.loads(path.read_text())]


REFUSED_433 = BUILDS["433c58ed7"].refused


def test_every_build_recorded_is_in_the_table_with_every_mode_recorded() -> None:
    recorded: dict[str, set[str]] = {}
    for source, mode, _ in _answers():
        recorded.setdefault(source, set()).add(mode)
    assert {"NONE", "DFLASH", "DDTREE"} <= recorded["433c58ed7"]
    assert len(RECORDINGS) >= 6  # refusals_{ddtree,dflash,base} and the INT4 runs
    for source, modes in recorded.items():
        build = build_refusals(source)
        assert build is not None, f"{source} was recorded: the table must say what it refuses"
        assert build.basis == RECORDED, f"{source} is recorded: the table's basis says so"
        assert set(build.refused) <= modes, f"a mode of {source} in the table was never recorded"
    for source, build in BUILDS.items():
        assert (build.basis == RECORDED) == (source in recorded), source


@pytest.mark.parametrize("run,mode,answer", _answers(),
                         ids=[f"{r}-{m}-{a['name']}" for r, m, a in _answers()])
def test_the_table_refuses_what_the_engine_refused_and_serves_the_rest(
        run: str, mode: str, answer: dict[str, Any]) -> None:
    chat = answer["path"].endswith("/chat/completions")
    needs = request_needs(answer["sent"], chat=chat)
    said = _refused(answer)
    found = limitation(source=run, algorithm=mode, body=answer["sent"], chat=chat)
    if not needs:
        # A request with no need the table knows (stop strings, a long prompt) is answered
        # alike by every mode, the baseline included: its refusals are not the mode's.
        assert found is None
        return
    if said is None:
        assert found is None, f"{run} served {answer['name']}, the table refuses it"
        return
    assert found is not None, f"{run} refused {answer['name']} ({said!r}), the table serves it"
    if answer["status"] == 500:  # streamed log-probs: the engine fails instead of refusing
        assert "output_token_logprobs_length" in said and found.need == LOGPROBS
    else:
        assert said == found.engine_message


def test_the_recording_wins_over_the_source_for_ddtrees_log_prob_message() -> None:
    """SGLang 433c58ed7's ddtree_worker_v2 says "DDTREE speculative decoding does not
    support return_logprob yet.", but the recorded DDTREE engine answered with DFLASH's
    check (it runs first): the table says what the engine said."""
    recorded = [a for run, mode, a in _answers()
                if run == "433c58ed7" and mode == "DDTREE" and a["name"] == "logprobs_chat"]
    assert recorded and all(_refused(a) == REFUSED_433["DDTREE"][LOGPROBS][1] for a in recorded)
    assert "DFLASH" in REFUSED_433["DDTREE"][LOGPROBS][1]


def test_n_above_one_was_served_by_every_mode_so_the_table_does_not_refuse_it() -> None:
    many = [(mode, a) for _, mode, a in _answers() if a["name"] == "n2"]
    assert {mode for mode, _ in many} >= {"NONE", "DFLASH", "DDTREE"}
    assert all(a["status"] == 200 and len(a["body"]["choices"]) == 2 for _, a in many)
    assert MANY_CHOICES in SERVED_BY_ALL
    assert all(MANY_CHOICES not in refused for build in BUILDS.values()
               for refused in build.refused.values())


def test_a_named_tool_choice_is_grammar_as_the_source_builds_it() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}
    found = limitation(source="433c58ed7", algorithm="DDTREE", body=body, chat=True)
    assert found is not None and (found.need, found.param) == (GRAMMAR, "tool_choice")
    assert limitation(source="433c58ed7", algorithm="DDTREE",
                      body={**body, "tool_choice": "auto"}, chat=True) is None
    assert limitation(source="433c58ed7", algorithm="NONE", body=body, chat=True) is None


def test_the_message_names_the_limitation_and_the_fix() -> None:
    found = limitation(source="433c58ed7", algorithm="ddtree",
                       body={"prompt": "x", "logprobs": 0}, chat=False)
    assert found is not None and not found.assumed
    text = found.message(algorithm="DDTREE")
    assert text.startswith("DDTREE cannot return log-probs on SGLang 433c58ed7")
    assert "companion: <name>" in text and "drop logprobs" in text
    assert "does not support return_logprob" in text  # the engine's words, for clients that look


LOGPROB_CHAT = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                "top_logprobs": 2}
JSON_MODE = {"messages": [{"role": "user", "content": "hi"}],
             "response_format": {"type": "json_object"}}


def test_dflash_on_0_5_23_serves_log_probs_and_grammar_as_its_source_reads() -> None:
    """0.5.23's validate_dflash_request refuses only return_hidden_states (with the overlap
    scheduler): a source reading, said as such, until a recording of 0.5.23 replaces it."""
    build = build_refusals("0.5.23")
    assert build is not None and build.basis == SOURCE_READING
    assert "validate_dflash_request" in build.evidence
    for body in (LOGPROB_CHAT, JSON_MODE):
        assert limitation(source="0.5.23", algorithm="DFLASH", body=body, chat=True) is None
        refused = limitation(source="433c58ed7", algorithm="DFLASH", body=body, chat=True)
        assert refused is not None and not refused.assumed
    assert build.needs("DDTREE") is None  # DDTREE is in no release


def test_a_build_the_table_does_not_know_is_assumed_to_refuse_what_a_known_one_did() -> None:
    for source in ("101cd5bd0", None):
        found = limitation(source=source, algorithm="DFLASH", body=LOGPROB_CHAT, chat=True)
        assert found is not None and found.assumed and found.need == LOGPROBS
        assert found.engine == ""  # no build named: the message says what was recorded
    assert limitation(source="101cd5bd0", algorithm="NONE", body=LOGPROB_CHAT,
                      chat=True) is None
