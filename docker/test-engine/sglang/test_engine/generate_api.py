"""/generate's answer in the shape 433c58ed7 gave it (tests/fixtures/real-engine/433c58ed7/
*probe*/probe.json): `text`, `output_ids` and `meta_info`; with `return_logprob` the
baseline's per-token and top-N log-probs, entries `[logprob, id, text or None]`. What the
engine refuses is its build's (refusals.py, TEST_ENGINE_BUILD): a build recorded refusing
log-probs under the launch's algorithm answers the recorded 400 with its message; one that
serves them serves them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sglang.test_engine import engine
from sglang.test_engine.logits import Step, steps, token_text
from sglang.test_engine.refusals import GRAMMAR, LOGPROBS


# The shapes of 433c58ed7's refusals (refusals_ddtree, refusals_dflash, the probes), the one
# build recorded refusing; the message is the imitated build's. /generate: a 400
# {"error": {"message"}}; /v1: serving_base.create_error_response's 400; a streamed grammar
# refusal a 200 whose one event is the error (type BAD_REQUEST), then [DONE]; streamed chat
# log-probs no refusal but a failure, a 500.
def generate_refusal(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


def openai_error(message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None,
            "code": 400}


def stream_error(message: str) -> str:
    return ("data: " + json.dumps({"error": {
        "object": "error", "message": message, "type": "BAD_REQUEST", "param": None,
        "code": 400}}) + "\n\ndata: [DONE]\n\n")


STREAM_LOGPROBS_FAILURE = {"object": "error",
                           "message": "Internal server error: 'output_token_logprobs_length'",
                           "type": "InternalServerError", "param": None, "code": 500}


def refused(need: str) -> str | None:
    """The imitated build's message for a need it refuses under the launch's algorithm."""
    return engine.REFUSALS.message(need) if engine.REFUSALS is not None else None


def openai_wants_grammar(body: dict[str, Any]) -> bool:
    """As SGLang's /v1 sets a grammar constraint: response_format json_schema, json_object
    or structural_tag; tool_choice "required" or a named function (with tools); its own
    regex / ebnf fields."""
    form = body.get("response_format")
    if isinstance(form, dict) and form.get("type") in ("json_schema", "json_object",
                                                        "structural_tag"):
        return True
    choice = body.get("tool_choice")
    if body.get("tools") and (choice == "required" or isinstance(choice, dict)):
        return True
    return bool(body.get("regex") or body.get("ebnf"))


def openai_refusal(body: dict[str, Any], *, chat: bool) -> tuple[int, Any] | None:
    """What the imitated build answers instead of serving the request, in the recorded
    shapes (status, a JSON body or an SSE text), or None when it serves it."""
    stream = bool(body.get("stream"))
    grammar = refused(GRAMMAR)
    if grammar and openai_wants_grammar(body):  # checked first: the validation order
        return (200, stream_error(grammar)) if stream else (400, openai_error(grammar))
    logprobs = refused(LOGPROBS)
    if logprobs and openai_wants_logprobs(body, chat=chat):
        return (500, STREAM_LOGPROBS_FAILURE) if stream and chat else \
            (400, openai_error(logprobs))
    return None


def prompt_key(body: dict[str, Any]) -> str:
    """The context the simulated model conditions on: the prompt text or its ids."""
    prompt = body.get("text")
    if isinstance(prompt, str):
        return prompt
    return json.dumps(body.get("input_ids") or "")


def generate_refused(body: dict[str, Any]) -> dict[str, Any] | None:
    """/generate's refusal of `return_logprob` where the imitated build refuses log-probs."""
    message = refused(LOGPROBS)
    return generate_refusal(message) if message and body.get("return_logprob") else None


def _entry(logprob: float, token: int, with_text: bool) -> list[Any]:
    return [logprob, token, token_text(token) if with_text else None]


def _logprobs(out: list[Step], top_n: int, with_text: bool) -> dict[str, Any]:
    chosen = []
    for s in out:
        # The token given, at its own log-prob: top-1's, or top-2's where it took that.
        logprob = next((lp for t, lp in s.top if t == s.token), s.top[0][1])
        chosen.append(_entry(logprob, s.token, with_text))
    tops = [[_entry(lp, t, with_text) for t, lp in s.top[:max(top_n, 0)]] for s in out]
    return {"input_token_logprobs": [], "output_token_logprobs": chosen,
            "output_token_logprobs_length": len(chosen), "input_top_logprobs": [],
            "output_top_logprobs": tops}


def answer(body: dict[str, Any], *, max_tokens: int, prompt_tokens: int, cached_tokens: int,
           latency_s: float) -> dict[str, Any]:
    out = steps(prompt_key(body), max_tokens, engine.PLANTED)
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": max_tokens},
        "prompt_tokens": prompt_tokens, "weight_version": "default", "num_retractions": 0,
        "queue_time": 0.0}
    if body.get("return_logprob"):
        meta.update(_logprobs(out, int(body.get("top_logprobs_num") or 0),
                              bool(body.get("return_text_in_logprobs"))))
    # As recorded (433c58ed7 probe.json): the device cache's share, null when none was hit.
    details = {"device": cached_tokens, "host": 0} if cached_tokens else None
    meta.update({"reasoning_tokens": 0, "completion_tokens": max_tokens,
                 "cached_tokens": cached_tokens, "cached_tokens_details": details,
                 "e2e_latency": latency_s})
    return {"text": "".join(token_text(s.token) for s in out),
            "output_ids": [s.token for s in out], "meta_info": meta}


# ---------------------------------------------------------------- /v1 with logprobs

def openai_wants_logprobs(body: dict[str, Any], *, chat: bool) -> bool:
    """As SGLang's /v1 sets return_logprob: chat `logprobs: true`; completions any
    `logprobs` number, 0 included."""
    return bool(body.get("logprobs")) if chat else body.get("logprobs") is not None


def openai_answer(prompt: str, max_tokens: int, body: dict[str, Any], *,
                  chat: bool) -> tuple[str, dict[str, Any] | None]:
    """The simulated model's text for `prompt` (the completion's prompt, or the chat's
    messages as JSON) and, when asked, its log-probs in the shapes SGLang's /v1 gives them
    (433c58ed7, entrypoints/openai/utils.to_openai_style_logprobs and serving_chat):
    completions `tokens`/`token_logprobs`/`top_logprobs` ({text: logprob}, text_offset -1),
    chat `content[]` of {token, bytes, logprob, top_logprobs}."""
    out = steps(prompt, max_tokens, engine.PLANTED)
    text = "".join(token_text(s.token) for s in out)
    if not openai_wants_logprobs(body, chat=chat):
        return text, None
    n = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
    chosen = [(token_text(s.token), next((lp for t, lp in s.top if t == s.token),
                                         s.top[0][1])) for s in out]
    tops = [[(token_text(t), lp) for t, lp in s.top[:max(n, 0)]] for s in out]
    if not chat:
        return text, {"text_offset": [-1] * len(out), "token_logprobs": [lp for _, lp in chosen],
                      "tokens": [t for t, _ in chosen],
                      "top_logprobs": [dict(top) for top in tops]}
    return text, {"content": [
        {"token": t, "bytes": list(t.encode()), "logprob": lp,
         "top_logprobs": [{"token": w, "bytes": list(w.encode()), "logprob": wl}
                          for w, wl in top]}
        for (t, lp), top in zip(chosen, tops, strict=True)]}
