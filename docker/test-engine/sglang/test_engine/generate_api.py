"""/generate's answer in the shape 433c58ed7 gave it (tests/fixtures/real-engine/433c58ed7/
*probe*/probe.json): `text`, `output_ids` and `meta_info`; with `return_logprob` the
baseline's per-token and top-N log-probs, entries `[logprob, id, text or None]`; a DFLASH
or DDTREE engine refuses log-probs with the recorded 400, as the real ones do."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sglang.test_engine import engine
from sglang.test_engine.logits import Step, steps, token_text

# 433c58ed7's answer to return_logprob on a DFLASH or DDTREE server (DDTREE runs DFLASH's
# worker, so it names DFLASH too).
LOGPROB_REFUSAL = {"error": {"message":
                             "DFLASH speculative decoding does not support return_logprob yet."}}
REFUSES_LOGPROBS = ("DFLASH", "DDTREE")


def prompt_key(body: dict[str, Any]) -> str:
    """The context the simulated model conditions on: the prompt text or its ids."""
    prompt = body.get("text")
    if isinstance(prompt, str):
        return prompt
    return json.dumps(body.get("input_ids") or "")


def refuses(body: dict[str, Any]) -> bool:
    return bool(body.get("return_logprob")) and engine.CFG.algo in REFUSES_LOGPROBS


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


def answer(body: dict[str, Any], *, max_tokens: int, prompt_tokens: int,
           latency_s: float) -> dict[str, Any]:
    out = steps(prompt_key(body), max_tokens, engine.PLANTED)
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": max_tokens},
        "prompt_tokens": prompt_tokens, "weight_version": "default", "num_retractions": 0,
        "queue_time": 0.0}
    if body.get("return_logprob"):
        meta.update(_logprobs(out, int(body.get("top_logprobs_num") or 0),
                              bool(body.get("return_text_in_logprobs"))))
    meta.update({"reasoning_tokens": 0, "completion_tokens": max_tokens, "cached_tokens": 0,
                 "e2e_latency": latency_s})
    return {"text": "".join(token_text(s.token) for s in out),
            "output_ids": [s.token for s in out], "meta_info": meta}
