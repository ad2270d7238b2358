"""Tune's losslessness check, for candidates that never run side by side: the baseline's
answers (with their top log-probs) are recorded while it is deployed, and each speculative
candidate's answers to the same prompts are judged against them later, by the same rule as
`appliance verify` (appliance.bench.lossless: the first divergence's log-prob margin).

A candidate is asked for log-probs too, and without them after its first refusal (SGLang's
speculative servers refuse them): its tokens are then compared as its /generate gives them,
and where a server gives only text, by that text against the baseline's token texts
(appliance.bench.verify.by_text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import aiohttp

from appliance.bench.verify import TIMEOUT_S, compare
from appliance.bench.verify_api import Endpoint, VerifyError, answer, post, refuses_logprobs

SHOWN = 200  # characters of a prompt kept in a result


async def record_baseline(url: str, prompts: Sequence[str], *, max_tokens: int,
                          stop: Callable[[], bool] = lambda: False) -> list[dict[str, Any]]:
    """The baseline's answers, one prompt at a time (a batch changes bf16 outputs)."""
    endpoint = Endpoint(url, "sglang", "the baseline")
    answers = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for index, prompt in enumerate(prompts, 1):
            if stop():
                break
            status, text = await post(session, endpoint, endpoint.body(
                prompt, max_tokens=max_tokens, logprobs=True))
            if refuses_logprobs(status, text):
                raise VerifyError(f"the baseline at {url} refuses log-probs ({text[:200]}); "
                                  "it runs without speculation and must give them")
            data = answer(endpoint, status, text, index)
            if not (data.get("meta_info") or {}).get("output_top_logprobs"):
                raise VerifyError(f"the baseline at {url} gave no output_top_logprobs")
            answers.append(data)
    return answers


async def check_candidate(url: str, prompts: Sequence[str], baseline: Sequence[dict[str, Any]],
                          *, max_tokens: int, threshold: float,
                          stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """The candidate's answers judged against the baseline's: the verdict counts, `passed`
    (no failure and no divergence that could not be judged), and each prompt's finding."""
    endpoint = Endpoint(url, "sglang", "the candidate")
    logprobs, refusal = True, ""
    results = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for index, (prompt, base) in enumerate(zip(prompts, baseline, strict=False), 1):
            if stop():
                break
            status, text = await post(session, endpoint, endpoint.body(
                prompt, max_tokens=max_tokens, logprobs=logprobs))
            if logprobs and refuses_logprobs(status, text):
                logprobs, refusal = False, f"HTTP {status}: {text[:200]}"
                status, text = await post(session, endpoint, endpoint.body(
                    prompt, max_tokens=max_tokens, logprobs=False))
            mine = answer(endpoint, status, text, index)
            results.append(compare(index, prompt[:SHOWN], mine, base, threshold=threshold))
    verdicts = [r.verdict for r in results]
    failures = sum(v in ("failure", "unknown") for v in verdicts)
    return {"passed": bool(results) and failures == 0 and len(results) == len(baseline),
            "total": len(results), "identical": verdicts.count("identical"),
            "near_ties": verdicts.count("near-tie"), "failures": failures,
            "threshold": threshold, "max_tokens": max_tokens,
            "logprobs": "given" if logprobs else refusal,
            "compared": "token ids" if all(
                isinstance(i, int) for b in baseline for i in b.get("output_ids", []))
            else "token texts",
            "prompts": [_brief(asdict(r)) for r in results if r.verdict != "identical"]}


def _brief(found: dict[str, Any]) -> dict[str, Any]:
    """A divergence as the results keep it (small enough for the row and its export)."""
    return json.loads(json.dumps(found, default=str))
