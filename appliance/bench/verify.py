"""`appliance verify`: does a speculative server (A) give its baseline's (B) tokens?

Each prompt goes to both servers at temperature 0 with `ignore_eos`, so both answer the same
number of tokens, through one of two APIs (`--api`, detected when not given):

- `sglang`: SGLang's native `/generate`. The token ids are compared.
- `openai`: `/v1/completions` with `logprobs` (or `/v1/chat/completions` with `logprobs` and
  `top_logprobs`, the prompt as one user message), with `--api-key` and `--model`: any
  OpenAI-compatible server, the appliance's gateway included. These APIs give no token ids,
  so the tokens compared are their texts (`logprobs.tokens`, `logprobs.content[].token`), one
  by one: a token split differently (`"ab"` against `"a"`, `"b"`) parts there, but two ids of
  the same text (byte pieces shown as U+FFFD) are the same token here, and the top log-probs
  of two tokens of one text come merged (SGLang keys them by text).

Only B must give log-probs (its top TOP_LOGPROBS). Whether A is asked for them is its engine
build's (appliance/engine/refusals.py, keyed by build, never by the algorithm's name) where
the caller names A's build and algorithm (`a_build`, `a_algorithm`; the panel does, from the
deployment's recipe): a build that refuses them (433c58ed7 under DDTREE and DFLASH, a 400
"does not support return_logprob yet", recorded) is not asked, and the result says so
(`a_engine`, `a_logprobs`, `compared`); through the gateway this also keeps A's requests on
A, where a log-prob request to such a deployment would go to its companion (the baseline). A
build that serves them (0.5.23 under DFLASH) is asked; should it refuse all the same, the
result says that the table is wrong for it. Where the caller names no build, A is asked
until its first refusal, then without them. Over OpenAI an A without log-probs gives only
its text: its tokens are taken to be B's as far as the two texts agree, and its token where
they part is the one of B's top log-probs there whose text the rest of A's text starts with
(none: a token outside them). A split of the same characters into other tokens cannot be
seen that way; the report says which comparison ran.

The outputs are compared by `first_divergence`: a part at a near-tie is bf16 noise, one at a
clear margin a failure. Prompts go one at a time: a batch changes bf16 outputs even without
speculation.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from appliance.bench.lossless import first_divergence
from appliance.bench.prompts import from_jsonl
from appliance.bench.verify_api import (
    Endpoint,
    VerifyError,
    answer,
    endpoints,
    post,
    refuses_ignore_eos,
    refuses_logprobs,
)
from appliance.engine.refusals import build_refusals, limitation

# Written for this project, and the prompts the real-engine rig probes with
# (tests/gpu/realengine/runs.py), so NEAR_TIE_GAP was measured on them: prose, code, SQL,
# numbers, a letter, Kimi's chat template.
BUILTIN_PROMPTS = (
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):\n    ",
    "Speculative decoding with a draft tree verifies many tokens at once. ",
    "0123456789 abcdefghij ",
    "Kimi K2 is a mixture-of-experts model with multi-head latent attention. " * 3,
    "SELECT name, count(*) FROM deployments WHERE status = 'ready' GROUP BY",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "Dear operator,\nThe engine finished loading its weights and",
    "[BOS]<|im_user|>user<|im_middle|>What is a draft tree?<|im_end|><|im_assistant|>",
    "for (int i = 0; i < n; ++i) {",
    "A B C D E F G H I J K L M N O P",
)
# The set shipped for the check (the twelve above and 24 MT-Bench questions, Apache-2.0):
# its source and license in appliance/bench/data/README.md.
SHIPPED_PROMPTS_FILE = Path(__file__).with_name("data") / "lossless-prompts.jsonl"
API_KEY_ENV = "SD_API_KEY"
SHOWN_TOKENS = 12  # of each continuation, from the first divergence
TIMEOUT_S = 600.0  # one answer; a cold Triton compile takes minutes


@dataclass
class Side:
    ids: list[int | str]  # token ids (SGLang's /generate) or token texts (OpenAI /v1)
    text: str | None  # the answer's text from the first divergence, where it is known
    text_from: str = "token"  # or "character": from the first character the texts differ at
    # The divergent token's own text, where a per-token text names it (the panel marks it).
    token_text: str | None = None


@dataclass
class PromptResult:
    index: int
    prompt: str
    verdict: str  # identical | near-tie | failure | unknown | not-greedy (B's own token)
    position: int | None = None
    gap: float | None = None
    candidate_in_top2: bool | None = None
    candidate_gap: float | None = None  # B's top-1 minus A's token's log-prob, where B gave it
    baseline_gap: float | None = None  # B's top-1 minus B's own token's log-prob there
    a: Side | None = None
    b: Side | None = None


@dataclass
class VerifyResult:
    a_url: str
    b_url: str
    threshold: float
    max_tokens: int
    a_logprobs: str  # "given" or the refusal, as A answered it
    prompts: list[PromptResult] = field(default_factory=list)
    api: str = "sglang"  # the API both were called through: sglang, completions or chat
    models: dict[str, str] = field(default_factory=dict)  # {"a": ..., "b": ...} (OpenAI)
    compared: str = "token ids"  # what was compared token by token (module docstring)
    notes: list[str] = field(default_factory=list)  # e.g. a server that refused ignore_eos
    # A's engine build and what its table says of log-probs (a_logprobs_plan); {} unnamed.
    a_engine: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> int:
        return sum(p.verdict == "identical" for p in self.prompts)

    @property
    def near_ties(self) -> int:
        return sum(p.verdict == "near-tie" for p in self.prompts)

    @property
    def failures(self) -> int:
        # A part where B gave no log-probs cannot be shown to be noise, nor one where B was
        # not greedy (its log-probs judge nothing there): both count against.
        return sum(p.verdict in ("failure", "unknown", "not-greedy") for p in self.prompts)

    @property
    def passed(self) -> bool:
        return self.failures == 0

    def to_dict(self) -> dict[str, Any]:
        total = len(self.prompts)
        return {"a": self.a_url, "b": self.b_url, "threshold": self.threshold,
                "max_tokens": self.max_tokens, "a_logprobs": self.a_logprobs,
                "api": self.api, "models": self.models, "compared": self.compared,
                "notes": self.notes, "a_engine": self.a_engine,
                "prompts": [asdict(p) for p in self.prompts],
                "total": total, "identical": self.identical,
                "match_rate": self.identical / total if total else None,
                "near_ties": self.near_ties, "failures": self.failures,
                "passed": self.passed}


# ---------------------------------------------------------------- the prompts

def shipped_prompts() -> list[str]:
    """The built-in set: the default of `appliance verify` and of the panel's check."""
    return [p.text for p in from_jsonl(SHIPPED_PROMPTS_FILE.read_text(encoding="utf-8"),
                                       output_len=1)]


# ---------------------------------------------------------------- the servers

def a_logprobs_plan(build: str | None, algorithm: str) -> dict[str, Any]:
    """What A's engine build does with a log-prob request under its algorithm, from the
    per-build table: `logprobs` "served" or "refused" (a build the table does not know:
    "refused" where a known build of the algorithm refused them, `assumed`), with the
    build's `title`, the table's `basis` and the engine's `message`."""
    known = build_refusals(build)
    found = limitation(source=build, algorithm=algorithm, body={"return_logprob": True},
                       chat=False)
    plan: dict[str, Any] = {
        "build": build or "", "algorithm": algorithm.upper(),
        "title": known.title if known is not None else (
            f"SGLang {build}" if build else "an engine build not recorded"),
        "basis": known.basis if known is not None and known.needs(algorithm) is not None
        else "", "logprobs": "served" if found is None else "refused",
        "assumed": bool(found and found.assumed), "message": found.engine_message if found
        else ""}
    return plan


class _Candidate:
    """A, asked for log-probs where its build serves them (or, its build unnamed, until it
    first refuses them)."""

    def __init__(self, endpoint: Endpoint, plan: dict[str, Any]) -> None:
        self.endpoint, self.logprobs, self.refusal = endpoint, True, ""
        self.refused_anyway = False  # the table said served, A refused
        if plan.get("logprobs") == "refused":
            self.logprobs = False
            how = "assumed: not recorded for this build" if plan["assumed"] else plan["basis"]
            self.refusal = (f"not asked: {plan['title']} refuses log-probs under "
                            f"{plan['algorithm']} ({how}; the engine answers "
                            f"\"{plan['message']}\")")

    async def generate(self, session: aiohttp.ClientSession, prompt: str, index: int, *,
                       max_tokens: int) -> dict[str, Any]:
        if self.logprobs:
            status, text = await _call(session, self.endpoint, prompt, max_tokens=max_tokens,
                                       logprobs=True)
            if not refuses_logprobs(status, text):
                return answer(self.endpoint, status, text, index)
            self.logprobs, self.refusal = False, f"HTTP {status}: {text[:300]}"
            self.refused_anyway = True
        status, text = await _call(session, self.endpoint, prompt, max_tokens=max_tokens,
                                   logprobs=False)
        return answer(self.endpoint, status, text, index)


async def _call(session: aiohttp.ClientSession, endpoint: Endpoint, prompt: str, *,
                max_tokens: int, logprobs: bool) -> tuple[int, str]:
    """One request; once more without `ignore_eos` where the server refused that field."""
    status, text = await post(session, endpoint, endpoint.body(
        prompt, max_tokens=max_tokens, logprobs=logprobs))
    if endpoint.ignore_eos and endpoint.api != "sglang" and refuses_ignore_eos(status, text):
        endpoint.ignore_eos = False
        status, text = await post(session, endpoint, endpoint.body(
            prompt, max_tokens=max_tokens, logprobs=logprobs))
    return status, text


async def _baseline(session: aiohttp.ClientSession, endpoint: Endpoint, prompt: str,
                    index: int, *, max_tokens: int) -> dict[str, Any]:
    status, text = await _call(session, endpoint, prompt, max_tokens=max_tokens,
                               logprobs=True)
    url = endpoint.url
    if refuses_logprobs(status, text):
        raise VerifyError(f"--b {url} refuses log-probs ({text[:200]}); the baseline judges "
                          "each divergence, so give a server without speculation as --b")
    data = answer(endpoint, status, text, index)
    if not (data.get("meta_info") or {}).get("output_top_logprobs"):
        what = ("output_top_logprobs" if endpoint.api == "sglang"
                else "no top log-probs (choices[0].logprobs)")
        raise VerifyError(f"--b {url} gave {what}; give a server that serves log-probs as --b")
    return data


# ---------------------------------------------------------------- comparing

def _continuation(answer: dict[str, Any], shared: str, position: int, text_from: str) -> Side:
    """From `position` on: ids, and the text after the shared prefix `shared`."""
    ids = [i if isinstance(i, str) else int(i)
           for i in answer["output_ids"][position:position + SHOWN_TOKENS]]
    text = answer.get("text")
    if not isinstance(text, str) or not text.startswith(shared):
        return Side(ids, None, text_from)
    return Side(ids, text[len(shared):], text_from)


def _shared_text(baseline: dict[str, Any], candidate: dict[str, Any],
                 position: int) -> tuple[str, str]:
    """The text both answers share, and where it ends: at the divergent token where B gave
    per-token texts, else at the first character the two texts differ at."""
    tokens = (baseline.get("meta_info") or {}).get("output_token_logprobs") or []
    texts = [t[2] if len(t) > 2 else None for t in tokens[:position]]
    if len(texts) == position and all(isinstance(t, str) for t in texts):
        return "".join(str(t) for t in texts), "token"
    a, b = str(candidate.get("text") or ""), str(baseline.get("text") or "")
    return os.path.commonprefix([a, b]), "character"


def by_text(candidate: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """A's answer with its tokens filled in from its text, where only the text is known (an
    OpenAI answer without log-probs): B's tokens as far as the two texts agree; where they
    part, the one of B's top tokens there whose text the rest of A's text starts with (the
    longest), or A's rest as one token outside them; none where A's text ends there."""
    text = str(candidate.get("text") or "")
    tokens = baseline["meta_info"].get("output_token_logprobs") or []
    tops = baseline["meta_info"].get("output_top_logprobs") or []
    ids: list[Any] = []
    start = 0
    for position, entry in enumerate(tokens):
        piece = str(entry[2] or "")
        if text.startswith(piece, start):
            ids.append(entry[1])
            start += len(piece)
            continue
        fits = [e for e in (tops[position] if position < len(tops) else [])
                if e[2] and text.startswith(str(e[2]), start)]
        if fits:
            ids.append(max(fits, key=lambda e: len(str(e[2])))[1])
        elif start < len(text):
            ids.append(_outside(text[start:]))
        return {**candidate, "output_ids": ids}
    if start < len(text):  # A wrote on past B's last token
        ids.append(_outside(text[start:]))
    return {**candidate, "output_ids": ids}


def _outside(rest: str) -> str:
    """A token of A's that is none of B's top ones: named by the text it starts."""
    return f"<not in B's top: {rest[:16]!r}...>"


def compare(index: int, prompt: str, candidate: dict[str, Any], baseline: dict[str, Any], *,
            threshold: float) -> PromptResult:
    if candidate.get("output_ids") is None:
        candidate = by_text(candidate, baseline)
    top = baseline["meta_info"]["output_top_logprobs"]
    found = first_divergence(baseline["output_ids"], top, candidate["output_ids"],
                             threshold=threshold)
    result = PromptResult(index, prompt, found.verdict, found.position, found.gap,
                          found.candidate_in_top2, found.candidate_gap, found.baseline_gap)
    if found.position is not None:
        shared, text_from = _shared_text(baseline, candidate, found.position)
        result.a = _continuation(candidate, shared, found.position, text_from)
        result.b = _continuation(baseline, shared, found.position, text_from)
        for side in (result.a, result.b):
            side.token_text = _token_text(side, top, found.position)
    return result


def _token_text(side: Side, top: list[Any], position: int) -> str | None:
    """The divergent token's text: from B's top-2 there (B's own token, and A's where A took
    B's second choice) when B gave per-token texts."""
    if not side.ids or position >= len(top):
        return None
    text = next((e[2] for e in top[position] if len(e) > 2 and e[1] == side.ids[0]), None)
    return text if isinstance(text, str) else None


class VerifyCancelled(Exception):
    """The caller's `cancelled()` said stop, between two prompts."""


async def verify(*, a_url: str, b_url: str, prompts: Sequence[str], max_tokens: int,
                 threshold: float, api: str = "auto", endpoint: str = "completions",
                 api_key: str = "", a_model: str = "", b_model: str = "",
                 a_build: str | None = None, a_algorithm: str = "",
                 on_prompt: Callable[[PromptResult], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> VerifyResult:
    """`api`, `endpoint`, `api_key` and the models: appliance.bench.verify_api.endpoints.
    `a_build` (Recipe.source_key, None where unknown) and `a_algorithm`: A's engine build
    and mode, whose table entry decides whether A is asked for log-probs (the module says
    how); no algorithm: A is asked until it first refuses. `on_prompt` hears each prompt's
    result as it is judged (the panel's progress); `cancelled` is asked before each
    prompt."""
    plan = a_logprobs_plan(a_build, a_algorithm) if a_algorithm else {}
    results = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        a_end, b_end = await endpoints(session, a_url=a_url, b_url=b_url, api=api,
                                       endpoint=endpoint, api_key=api_key, a_model=a_model,
                                       b_model=b_model)
        candidate = _Candidate(a_end, plan)
        for index, prompt in enumerate(prompts, 1):
            if cancelled is not None and cancelled():
                raise VerifyCancelled(f"cancelled before prompt {index}")
            # A and B at once (two servers), but one prompt at a time on each.
            a, b = await asyncio.gather(
                candidate.generate(session, prompt, index, max_tokens=max_tokens),
                _baseline(session, b_end, prompt, index, max_tokens=max_tokens))
            results.append(compare(index, prompt, a, b, threshold=threshold))
            if on_prompt is not None:
                on_prompt(results[-1])
    result = VerifyResult(a_url, b_url, threshold, max_tokens,
                          "given" if candidate.logprobs else candidate.refusal, results,
                          api=a_end.api)
    result.a_engine = plan
    if a_end.api != "sglang":
        result.models = {"a": a_end.model, "b": b_end.model}
        why = ("its engine build refuses log-probs, so none were asked"
               if plan.get("logprobs") == "refused" else "it gave no log-probs")
        result.compared = "token texts" if candidate.logprobs else (
            f"token texts (A's tokens read from its text: {why})")
    result.notes = [f"{e.flag} {e.url} refused ignore_eos: its answers end at its EOS"
                    for e in (a_end, b_end) if not e.ignore_eos]
    if plan.get("logprobs") == "refused":
        result.notes.append(f"A was not asked for log-probs: {plan['title']} refuses them "
                            f"under {plan['algorithm']}; its tokens are compared with B's, "
                            "whose log-probs judge each divergence")
    if plan and candidate.refused_anyway:
        result.notes.append(f"A refused log-probs although the refusal table says "
                            f"{plan['title']} serves them under {plan['algorithm']} "
                            "(appliance/engine/refusals.py): the table is wrong for this "
                            "engine; its tokens were compared without them")
    return result
