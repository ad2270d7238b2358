"""What an engine refuses to serve is a property of its build (SGLang's source or release),
not of the speculative algorithm's name: the same DFLASH request is refused by one build and
served by another.

Builds are keyed as recipes key SGLang knowledge (appliance.engine.recipes.Recipe.source_key):
a release ("0.5.23") or a commit's first 9 hex digits ("433c58ed7"). Per build, each entry
says where its answers come from:

- 433c58ed7 (ddtree-v2, the DDTREE recipe's source): RECORDED on an H200
  (tests/fixtures/real-engine/433c58ed7/refusals_*/refusals.json, and the INT4 runs'
  refusals.json): the same requests sent to a DDTREE, a DFLASH and a baseline engine.
  tests/appliance/engine/test_refusals.py holds this table to them; where SGLang's source
  says otherwise, the recording wins (the DDTREE worker's own log-prob message names DDTREE,
  but the recorded answer names DFLASH: DDTREE runs DFLASH's request check first).
  - grammar (`response_format` json_schema or json_object, `tool_choice` "required"): DFLASH
    and DDTREE answer 400 "DFLASH speculative decoding does not support grammar-constrained
    decoding yet." (a stream: a 200 whose one event is that error); the baseline serves it.
  - log-probs (chat `logprobs`/`top_logprobs`, completions `logprobs`): 400 "DFLASH
    speculative decoding does not support return_logprob yet." (streamed chat: a 500,
    "Internal server error: 'output_token_logprobs_length'"); the baseline serves it.
  - `n: 2`: every mode serves it (200, two choices); `tool_choice: "auto"`, stop strings, a
    prompt that fits the context: served by every mode.
  Not recorded, from the source alone (serving_chat and dflash_utils.validate_dflash_request
  of 433c58ed7, line 796): a named function in `tool_choice` is constrained like "required"
  (a json_schema constraint), and SGLang's own `regex`/`ebnf` fields are grammar too;
  `return_logprob` (the native API's flag) is the log-prob check itself.
- 0.5.23 (PyPI, the DFLASH and baseline recipes' release): a SOURCE READING, not a
  recording. The wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl (sha256
  00b3cd5b...9937): `validate_dflash_request` (sglang/srt/speculative/dflash_utils.py, line
  1108), which the scheduler applies to the DFlash family (managers/scheduler.py, line 3145),
  refuses only `return_hidden_states` under the overlap scheduler; the DFLASH worker computes
  speculative log-probs (`compute_spec_logprobs`, speculative/dflash_worker_v2.py) and
  verifies with the grammar (`batch.has_grammar`). So DFLASH on 0.5.23 serves log-probs and
  grammar. DDTREE is in no release: a 0.5.23 build has none.

A build not in the table (another commit, a site's own source) is unknown: `limitation`
then answers with the most a recorded build of that algorithm refused, marked `assumed`, so
that the gateway hands such a request to a companion where the spec names one (the baseline
serves everything) and otherwise lets the engine give its own answer.

Framework-free: the gateway (web/gateway/proxy.py) asks `limitation` per request, with the
deployment's build (`recipe_source`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.engine.recipes import RecipeError, load_site_recipe

GRAMMAR = "grammar"
LOGPROBS = "logprobs"
MANY_CHOICES = "n"


@dataclass(frozen=True)
class Limitation:
    """A need a mode cannot serve: the engine's own message, and what the client asked."""

    need: str
    what: str  # e.g. "return log-probs"
    engine_message: str  # SGLang's answer, as recorded
    param: str  # the request field to name
    # The build is not in the table: the need is what a known build refused (not its own).
    assumed: bool = False
    engine: str = ""  # the build's title, e.g. "SGLang 433c58ed7 (...)"; "" where unknown

    def message(self, *, algorithm: str) -> str:
        drop = {LOGPROBS: "drop logprobs", GRAMMAR: "drop the response_format / tool_choice "
                "constraint", MANY_CHOICES: "ask for n: 1"}[self.need]
        on = f" on {self.engine}" if self.engine else ""
        return (f"{algorithm} cannot {self.what}{on} (the engine answers: "
                f"\"{self.engine_message}\"); "
                f"name a companion deployment in the spec (companion: <name>), a baseline of "
                f"the same target without speculation, or {drop}.")


GRAMMAR_MESSAGE = "DFLASH speculative decoding does not support grammar-constrained decoding yet."
LOGPROBS_MESSAGE = "DFLASH speculative decoding does not support return_logprob yet."
GRAMMAR_WHAT = "follow a grammar (JSON mode, a JSON schema, a required tool call)"
LOGPROBS_WHAT = "return log-probs"

RECORDED = "recorded"
SOURCE_READING = "source reading"


@dataclass(frozen=True)
class BuildRefusals:
    """What one engine build refuses, per speculative algorithm it has."""

    source: str  # Recipe.source_key: a release or a commit's first 9 hex digits
    title: str  # e.g. "SGLang 0.5.23 (PyPI)"
    # Per algorithm the build has (upper case): need -> (what, the engine's message).
    refused: dict[str, dict[str, tuple[str, str]]]
    basis: str  # RECORDED or SOURCE_READING
    evidence: str  # where the answers come from (a recording's folder, a source's file)

    def needs(self, algorithm: str) -> dict[str, tuple[str, str]] | None:
        """The needs this build refuses under `algorithm`; None where it has no such mode."""
        return self.refused.get(algorithm.upper())


_DFLASH_433 = {GRAMMAR: (GRAMMAR_WHAT, GRAMMAR_MESSAGE),
               LOGPROBS: (LOGPROBS_WHAT, LOGPROBS_MESSAGE)}
BUILDS: dict[str, BuildRefusals] = {
    "433c58ed7": BuildRefusals(
        source="433c58ed7", title="SGLang 433c58ed7 (Rancy-Wang/sglang ddtree-v2)",
        refused={"NONE": {}, "DFLASH": dict(_DFLASH_433), "DDTREE": dict(_DFLASH_433)},
        basis=RECORDED,
        evidence="tests/fixtures/real-engine/433c58ed7/refusals_{ddtree,dflash,base}/"
                 "refusals.json and the INT4 runs' (an H200, 2026-12-03)"),
    "0.5.23": BuildRefusals(
        source="0.5.23", title="SGLang 0.5.23 (PyPI)",
        refused={"NONE": {}, "DFLASH": {}},
        basis=SOURCE_READING,
        evidence="sglang 0.5.23's validate_dflash_request (sglang/srt/speculative/"
                 "dflash_utils.py) refuses only return_hidden_states with the overlap "
                 "scheduler; its DFLASH worker computes log-probs and verifies with the "
                 "grammar (not recorded on a GPU)"),
}
# Recorded as served by every build and mode (n: 2 gave two choices on every mode): said
# here so that the test can hold it to the recordings too.
SERVED_BY_ALL = frozenset({MANY_CHOICES})


def build_refusals(source: str | None) -> BuildRefusals | None:
    """The table's entry for a build (Recipe.source_key), or None where it has none."""
    return BUILDS.get(source or "")


def assumed_needs(algorithm: str) -> dict[str, tuple[str, str]]:
    """For a build the table does not know: every need a known build refused under this
    algorithm (the most any did)."""
    out: dict[str, tuple[str, str]] = {}
    for build in BUILDS.values():
        out.update(build.needs(algorithm) or {})
    return out


def request_needs(body: dict[str, Any], *, chat: bool) -> dict[str, str]:
    """The needs a parsed OpenAI request has, each with the field that asks for it."""
    needs: dict[str, str] = {}
    if chat:
        if body.get("logprobs") or body.get("top_logprobs"):
            needs[LOGPROBS] = "logprobs"
    elif body.get("logprobs") is not None and body.get("logprobs") is not False:
        needs[LOGPROBS] = "logprobs"  # a completion's logprobs: 0 asks for them too
    if body.get("return_logprob"):
        needs[LOGPROBS] = "return_logprob"
    grammar = _grammar_field(body)
    if grammar:
        needs[GRAMMAR] = grammar
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        needs[MANY_CHOICES] = "n"
    return needs


def _grammar_field(body: dict[str, Any]) -> str:
    form = body.get("response_format")
    if isinstance(form, dict) and form.get("type") in ("json_schema", "json_object",
                                                        "structural_tag"):
        return "response_format"
    choice = body.get("tool_choice")
    if body.get("tools") and (choice == "required" or (
            isinstance(choice, dict) and choice.get("type") == "function")):
        return "tool_choice"
    for field in ("regex", "ebnf", "json_schema"):
        if body.get(field):
            return field
    return ""


def limitation(*, source: str | None, algorithm: str, body: dict[str, Any],
               chat: bool) -> Limitation | None:
    """The first need of this request that the engine build `source` refuses under
    `algorithm`, or None when it serves it. For a build the table does not know, the most
    a known build refused, marked `assumed`."""
    build = build_refusals(source)
    refused = build.needs(algorithm) if build is not None else None
    assumed = refused is None
    if refused is None:
        refused = assumed_needs(algorithm)
    if not refused:
        return None
    for need, param in request_needs(body, chat=chat).items():
        if need in refused:
            what, message = refused[need]
            return Limitation(need=need, what=what, engine_message=message, param=param,
                              assumed=assumed, engine=build.title if build else "")
    return None


_SOURCES: dict[tuple[str, str], tuple[float, str | None]] = {}
SOURCE_TTL_S = 30.0  # a site recipe edited in place is read again after this


def recipe_source(recipe: str, site_dir: str | Path | None) -> str | None:
    """The engine build (Recipe.source_key) of a deployment's recipe, by name as the panel
    and a joined host load it (the site's file wins over a shipped one); None where the
    recipe cannot be read. Read at most every SOURCE_TTL_S per recipe: the gateway asks for
    every deployment each second."""
    key = (recipe, str(site_dir or ""))
    now = time.monotonic()
    hit = _SOURCES.get(key)
    if hit is not None and now - hit[0] < SOURCE_TTL_S:
        return hit[1]
    try:
        source = load_site_recipe(recipe, site_dir).source_key if recipe else None
    except (RecipeError, OSError, ValueError):
        source = None
    _SOURCES[key] = (now, source)
    return source


def table() -> dict[str, Any]:
    """The table as plain data: per build, its title, basis, evidence and, per algorithm it
    has, the needs it refuses with the engine's message. The simulator ships a copy of it
    (docker/test-engine/sglang/test_engine/refusals.json), written by
    `python3 -m appliance.engine.refusals write FILE`; a test holds the copy equal to this."""
    return {"served_by_all": sorted(SERVED_BY_ALL), "builds": {
        source: {"title": build.title, "basis": build.basis, "evidence": build.evidence,
                 "refused": {algorithm: {need: message for need, (_, message)
                                         in sorted(needs.items())}
                             for algorithm, needs in sorted(build.refused.items())}}
        for source, build in sorted(BUILDS.items())}}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "write":
        print("usage: python3 -m appliance.engine.refusals write FILE", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {argv[1]}: {', '.join(sorted(BUILDS))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
