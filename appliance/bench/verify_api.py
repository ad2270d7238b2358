"""How `appliance verify` calls a server: SGLang's native `/generate` or an OpenAI-compatible
`/v1` (completions or chat), which API a server speaks, and each answer in one shape.

Every answer becomes `/generate`'s own shape (433c58ed7, tests/fixtures/real-engine/433c58ed7/
*probe*/probe.json), which the comparison reads: `text`, `output_ids` (the tokens compared:
ids from `/generate`, token texts from `/v1`; None where a `/v1` answer has no log-probs, so
only its text is known) and, with log-probs, `meta_info.output_token_logprobs` and
`output_top_logprobs`, entries `[logprob, token, text]`, the top ones best first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from appliance.bench.lossless import TOP_LOGPROBS

APIS = ("auto", "sglang", "openai")
ENDPOINTS = ("completions", "chat")
PATHS = {"sglang": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}
PROBE_TIMEOUT_S = 10.0


class VerifyError(Exception):
    """A usage error: exit 2 with this message (bad URL, prompts file, unreachable server)."""


@dataclass
class Endpoint:
    """One server as the check calls it."""

    url: str
    api: str  # a key of PATHS
    flag: str  # "--a" or "--b": how errors name it
    model: str = ""  # the OpenAI request's `model`
    api_key: str = field(default="", repr=False)
    # Dropped after the server refused it with a 400 naming it (a strict OpenAI server): then
    # its answers end at its EOS.
    ignore_eos: bool = True

    @property
    def where(self) -> str:
        return self.url + PATHS[self.api]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, prompt: str, *, max_tokens: int, logprobs: bool) -> dict[str, Any]:
        if self.api == "sglang":
            return generate_body(prompt, max_tokens=max_tokens, logprobs=logprobs,
                                 ignore_eos=self.ignore_eos)
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                "temperature": 0}
        if self.ignore_eos:
            body["ignore_eos"] = True  # SGLang's and vLLM's extension
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            if logprobs:
                body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        else:
            body["prompt"] = prompt
            if logprobs:
                body["logprobs"] = TOP_LOGPROBS
        return body


def generate_body(prompt: str, *, max_tokens: int, logprobs: bool,
                  ignore_eos: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": ignore_eos}}
    if logprobs:
        # Per-token text lets the continuations be shown as text, not only as ids.
        body.update(return_logprob=True, top_logprobs_num=TOP_LOGPROBS,
                    return_text_in_logprobs=True)
    return body


def refuses_logprobs(status: int, body: str) -> bool:
    return status == 400 and "logprob" in body


def refuses_ignore_eos(status: int, body: str) -> bool:
    return status == 400 and "ignore_eos" in body


async def post(session: aiohttp.ClientSession, endpoint: Endpoint,
               body: dict[str, Any]) -> tuple[int, str]:
    try:
        async with session.post(endpoint.where, json=body, headers=endpoint.headers) as resp:
            return resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise VerifyError(f"{endpoint.url} is unreachable: {exc or type(exc).__name__}; is the "
                          "server up and the URL its base URL?") from exc


# ---------------------------------------------------------------- answers

def answer(endpoint: Endpoint, status: int, text: str, prompt_index: int) -> dict[str, Any]:
    """The answer in /generate's shape; a VerifyError naming the server where it is not one."""
    where = endpoint.where
    if status != 200:
        raise VerifyError(f"{where} answered HTTP {status} for prompt {prompt_index}: "
                          f"{text[:300]}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{where} answered prompt {prompt_index} with no JSON; is it "
                          f"{_kind(endpoint)}?") from exc
    shaped = (_from_generate(data) if endpoint.api == "sglang"
              else _from_openai(data, chat=endpoint.api == "chat"))
    if shaped is None:
        missing = "output_ids" if endpoint.api == "sglang" else "choices[0]"
        raise VerifyError(f"{where} answered prompt {prompt_index} without {missing}; is it "
                          f"{_kind(endpoint)}?")
    return shaped


def _kind(endpoint: Endpoint) -> str:
    return "an SGLang server" if endpoint.api == "sglang" else "an OpenAI-compatible server"


def _from_generate(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict) or not isinstance(data.get("output_ids"), list):
        return None
    return data


def _from_openai(data: Any, *, chat: bool) -> dict[str, Any] | None:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        tokens = _chat_tokens(choice.get("logprobs"))
    else:
        text, tokens = choice.get("text"), _completion_tokens(choice.get("logprobs"))
    out: dict[str, Any] = {"text": text if isinstance(text, str) else "", "output_ids": None,
                           "meta_info": {}}
    if tokens is not None:
        chosen, tops = tokens
        out["output_ids"] = [token for _, token, _ in chosen]
        out["meta_info"] = {"output_token_logprobs": chosen, "output_top_logprobs": tops}
    return out


Entry = list[Any]  # [logprob, token, text]


def _best_first(pairs: list[tuple[str, float]]) -> list[Entry]:
    return [[lp, token, token] for token, lp in sorted(pairs, key=lambda p: -p[1])]


def _completion_tokens(logprobs: Any) -> tuple[list[Entry], list[list[Entry]]] | None:
    """`logprobs`: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: lp}]}."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        return None
    tokens, lps = logprobs["tokens"], logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    chosen = [[lps[i] if i < len(lps) else None, str(t), str(t)] for i, t in enumerate(tokens)]
    top = [_best_first([(str(k), float(v)) for k, v in (t or {}).items()])
           if isinstance(t, dict) or t is None else [] for t in tops]
    return chosen, top


def _chat_tokens(logprobs: Any) -> tuple[list[Entry], list[list[Entry]]] | None:
    """`logprobs`: {"content": [{"token", "logprob", "top_logprobs": [{"token",
    "logprob"}]}]}."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    chosen, tops = [], []
    for item in content:
        item = item if isinstance(item, dict) else {}
        token = str(item.get("token", ""))
        chosen.append([item.get("logprob"), token, token])
        tops.append(_best_first([(str(t.get("token", "")), float(t.get("logprob", 0.0)))
                                 for t in item.get("top_logprobs") or []
                                 if isinstance(t, dict)]))
    return chosen, tops


# ---------------------------------------------------------------- which API

@dataclass(frozen=True)
class Spoken:
    """What one server answered the probes: SGLang's own /model_info, and /v1/models."""

    native: bool
    models: list[str] | None  # None: no /v1/models
    refusal: str = ""  # /v1/models's 401 or 403, where it gave one


async def _get(session: aiohttp.ClientSession, url: str, path: str,
               headers: dict[str, str]) -> tuple[int, Any]:
    try:
        async with session.get(url + path, headers=headers, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise VerifyError(f"{url} is unreachable: {exc or type(exc).__name__}; is the server "
                          "up and the URL its base URL?") from exc
    try:
        return resp.status, json.loads(text)
    except json.JSONDecodeError:
        return resp.status, text


async def spoken(session: aiohttp.ClientSession, url: str, api_key: str) -> Spoken:
    """SGLang answers GET /model_info with its model_path (a gateway or another server: 404,
    or a login page); an OpenAI server lists its models at /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    status, info = await _get(session, url, "/model_info", headers)
    native = status == 200 and isinstance(info, dict) and "model_path" in info
    status, listed = await _get(session, url, "/v1/models", headers)
    if status in (401, 403):
        return Spoken(native, None, f"HTTP {status}: {str(listed)[:200]}")
    data = listed.get("data") if status == 200 and isinstance(listed, dict) else None
    if not isinstance(data, list):
        return Spoken(native, None)
    return Spoken(native, [str(m.get("id")) for m in data if isinstance(m, dict)])


def _model(flag: str, url: str, chosen: str, listed: Spoken) -> str:
    if chosen:
        return chosen
    models = listed.models or []
    if len(models) == 1:
        return models[0]
    if listed.models is None:
        raise VerifyError(f"{flag} {url} answers neither SGLang's /model_info nor "
                          "/v1/models; give the server's base URL (without /v1), or name "
                          "the model with --model")
    if not models:
        raise VerifyError(f"{flag} {url}/v1/models lists no model; name it with --model")
    raise VerifyError(f"{flag} {url} serves {', '.join(models)}: name the one to check with "
                      f"{flag}-model (or --model for both)")


async def endpoints(session: aiohttp.ClientSession, *, a_url: str, b_url: str, api: str,
                    endpoint: str = "completions", api_key: str = "", a_model: str = "",
                    b_model: str = "") -> tuple[Endpoint, Endpoint]:
    """A and B, both on one API: `api` as given, or (auto) SGLang's own where both answer
    its /model_info and no model is named (token ids compared), else OpenAI's."""
    if api not in APIS:
        raise VerifyError(f"--api: {api!r} is not one of {', '.join(APIS)}")
    if endpoint not in ENDPOINTS:
        raise VerifyError(f"--endpoint: {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
    if api == "sglang":
        return (Endpoint(a_url, "sglang", "--a", api_key=api_key),
                Endpoint(b_url, "sglang", "--b", api_key=api_key))
    a, b = (await spoken(session, a_url, api_key), await spoken(session, b_url, api_key))
    if api == "auto" and a.native and b.native and not (a_model or b_model):
        return await endpoints(session, a_url=a_url, b_url=b_url, api="sglang",
                               api_key=api_key)
    for flag, url, said in (("--a", a_url, a), ("--b", b_url, b)):
        if said.refusal:
            hint = ("give the gateway's API key with --api-key or $SD_API_KEY" if not api_key
                    else "is the key right, not revoked, and allowed this deployment?")
            raise VerifyError(f"{flag} {url}/v1/models refused the call ({said.refusal}); "
                              f"{hint}")
    return (Endpoint(a_url, endpoint, "--a", _model("--a", a_url, a_model, a), api_key),
            Endpoint(b_url, endpoint, "--b", _model("--b", b_url, b_model, b), api_key))
