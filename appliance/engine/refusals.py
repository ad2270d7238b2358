"""What each speculative mode of the engine refuses to serve, as the real engine answered.

The reference is 433c58ed7's recordings (tests/fixtures/real-engine/433c58ed7/refusals_*/
refusals.json, and the INT4 runs' refusals.json): the same requests sent to a DDTREE, a
DFLASH and a baseline engine. tests/engine/test_refusals.py reads them and holds this table
to them; where SGLang's source says otherwise, the recording wins (the DDTREE worker's own
log-prob message names DDTREE, but the recorded answer names DFLASH: DDTREE runs DFLASH's
request check first).

What the recordings say:
- grammar (`response_format` json_schema or json_object, `tool_choice` "required"): DFLASH and
  DDTREE answer 400 "DFLASH speculative decoding does not support grammar-constrained decoding
  yet." (a stream: a 200 whose one event is that error); the baseline serves it.
- log-probs (chat `logprobs`/`top_logprobs`, completions `logprobs`): 400 "DFLASH speculative
  decoding does not support return_logprob yet." (streamed chat: a 500, "Internal server
  error: 'output_token_logprobs_length'"); the baseline serves it.
- `n: 2`: every mode serves it (200, two choices): n > 1 is no limitation of these modes.
- `tool_choice: "auto"`, stop strings, a prompt that fits the context: served by every mode.

Not recorded, from the source alone (serving_chat and dflash_utils.validate_dflash_request of
433c58ed7): a named function in `tool_choice` is constrained like "required" (a json_schema
constraint), and SGLang's own `regex`/`ebnf` fields are grammar too; `return_logprob` (the
native API's flag) is the log-prob check itself.

Framework-free: the gateway (web/gateway/proxy.py) asks `limitation` per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def message(self, *, algorithm: str) -> str:
        drop = {LOGPROBS: "drop logprobs", GRAMMAR: "drop the response_format / tool_choice "
                "constraint", MANY_CHOICES: "ask for n: 1"}[self.need]
        return (f"{algorithm} cannot {self.what} (the engine answers: \"{self.engine_message}\"); "
                f"name a companion deployment in the spec (companion: <name>), a baseline of "
                f"the same target without speculation, or {drop}.")


GRAMMAR_MESSAGE = "DFLASH speculative decoding does not support grammar-constrained decoding yet."
LOGPROBS_MESSAGE = "DFLASH speculative decoding does not support return_logprob yet."

# Per speculative_algorithm (the spec's, upper case): the needs the mode refuses. A mode not
# listed here (NONE, or one never recorded) is taken to serve everything.
REFUSED: dict[str, dict[str, tuple[str, str]]] = {
    mode: {GRAMMAR: ("follow a grammar (JSON mode, a JSON schema, a required tool call)",
                     GRAMMAR_MESSAGE),
           LOGPROBS: ("return log-probs", LOGPROBS_MESSAGE)}
    for mode in ("DFLASH", "DDTREE")}
# Recorded as served (n: 2 gave two choices on every mode): said here so that the test can
# hold it to the recordings too.
SERVED_BY_ALL = frozenset({MANY_CHOICES})


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


def limitation(*, algorithm: str, body: dict[str, Any], chat: bool) -> Limitation | None:
    """The first need of this request the mode refuses, or None when it can serve it."""
    refused = REFUSED.get(algorithm.upper())
    if not refused:
        return None
    for need, param in request_needs(body, chat=chat).items():
        if need in refused:
            what, message = refused[need]
            return Limitation(need=need, what=what, engine_message=message, param=param)
    return None
