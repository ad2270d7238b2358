"""The gateway's data plane: a thin ASGI pass-through in the panel's own uvicorn process.

Only /v1/models, /v1/chat/completions and /v1/completions exist; everything else under /v1
is a 404 here and never reaches an engine (SGLang's admin and internal routes, /generate,
/flush_cache, /load_lora_adapter_from_tensors, /server_info, /metrics, stay unreachable).
Streams pass through as the engine wrote them, event by event, in order; the engine's own
usage (the body's `usage`, or a stream's last chunk) is counted per key and deployment.
docs/gateway.md says why this and not sglang-router, with the measured overhead.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from appliance.engine.refusals import limitation
from appliance.nesting import TooDeep, json_loads_bounded
from web.asgitypes import ASGIApp, Receive, Scope, Send
from web.gateway import services
from web.gateway.admission import (
    NO_CREDENTIALS,
    Caller,
    Refusal,
    models_for,
    session_caller,
    target_for,
)
from web.gateway.relay import refuse, relay_watching, send_json
from web.gateway.routing import routing
from web.gateway.selectors import Target
from web.gateway.usage import UsageTap, asked_usage, usage_writer, with_usage_option

log = logging.getLogger(__name__)


ROUTES = {"/v1/models": "GET", "/v1/chat/completions": "POST", "/v1/completions": "POST"}


def with_gateway(django_app: ASGIApp) -> ASGIApp:
    """The panel's ASGI app with /v1 answered here, before Django's middleware runs."""
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/v1" or path.startswith("/v1/"):
            await handle(scope, receive, send)
        else:
            await django_app(scope, receive, send)
    return app


def _bad_request(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, message, "invalid_request_error", "invalid_request", param=param)


# ------------------------------------------------------------------ the request

def _credentials(scope: Scope) -> tuple[str | None, bool]:
    """(the bearer secret or None, whether a cookie came): what admission has to go on."""
    secret, cookie = None, False
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            secret = token.strip() if kind.lower() == "bearer" else ""
        elif name == b"cookie":
            cookie = True
    return secret, cookie


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when it is over the gateway's limit."""
    limit, chunks, size = settings.GATEWAY_MAX_BODY_BYTES, [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


# An OpenAI request is a few levels deep (messages, content parts, tools with their JSON
# schemas); past this it is no request, and parsing further would recurse without end.
MAX_JSON_DEPTH = 64
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def _parse(body: bytes) -> dict[str, Any] | Refusal:
    try:
        data = json_loads_bounded(body or b"null", limit=MAX_JSON_DEPTH)
    except TooDeep:
        return _bad_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels: "
                            "send an OpenAI request object (messages, tools and schemas well "
                            "within that).")
    except (ValueError, UnicodeDecodeError):
        return _bad_request("The request body is not JSON: send an OpenAI request object.")
    if not isinstance(data, dict):
        return _bad_request("The request body must be a JSON object.")
    if not isinstance(data.get("model"), str) or not data["model"]:
        return _bad_request("`model` is required: the deployment's served model name (GET "
                            "/v1/models lists them).", param="model")
    if "stream" in data and not isinstance(data["stream"], bool):
        return _bad_request("`stream` must be true or false.", param="stream")
    return data


def _token_refusal(data: dict[str, Any], target: Target) -> Refusal | None:
    """max_tokens (or max_completion_tokens) over what the deployment can give: its context
    length, else the gateway's cap. Refused here, before an engine queues a generation that a
    client cannot wait for (and that runs on after the client leaves, until it notices)."""
    cap = target.context_length or settings.GATEWAY_MAX_TOKENS
    for name in TOKEN_FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return Refusal(400, f"`{name}` must be a positive whole number of tokens, not "
                           f"{json.dumps(value)[:40]}.", "invalid_request_error",
                           "invalid_value", param=name)
        if value > cap:
            bound = (f"the deployment's context length, {cap} tokens (engine.context_length)"
                     if target.context_length else
                     f"the gateway's cap, {cap} tokens (APPLIANCE_GATEWAY_MAX_TOKENS; a "
                     "spec's engine.context_length sets a deployment's own)")
            return Refusal(400, f"`{name}` is {value}, more than {bound}: ask for at most "
                           f"{cap}.", "invalid_request_error", "invalid_value", param=name)
    return None


async def handle(scope: Scope, receive: Receive, send: Send) -> None:
    path, method = scope["path"], scope["method"]
    if path not in ROUTES:
        await refuse(send, Refusal(404, f"Unknown URL {path}: the gateway serves only "
                                    f"{', '.join(sorted(ROUTES))}.", "invalid_request_error",
                                    "unknown_url"))
        return
    if method != ROUTES[path]:
        await refuse(send, Refusal(405, f"{path} takes {ROUTES[path]}, not {method}.",
                                    "invalid_request_error", "method_not_allowed"))
        return
    secret, cookie = _credentials(scope)
    if secret is None and not cookie:
        await refuse(send, NO_CREDENTIALS)  # no database work for an anonymous call
        return
    # The key first: a caller the gateway refuses has none of its body read or parsed.
    caller = await _caller(scope, secret)
    if isinstance(caller, Refusal):
        await refuse(send, caller)
        return
    if path == "/v1/models":
        refusal = await _rate_limited(caller)
        if refusal is not None:
            await refuse(send, refusal)
            return
        await _list_models(send, caller)
        return
    body = await _read_body(receive)
    if body is None:
        await refuse(send, Refusal(413, "The request body is over the gateway's limit "
                                    f"({settings.GATEWAY_MAX_BODY_BYTES} bytes, "
                                    "APPLIANCE_GATEWAY_MAX_BODY_BYTES).",
                                    "invalid_request_error", "body_too_large"))
        return
    await _generate(receive, send, path, caller, body)


async def _caller(scope: Scope, secret: str | None) -> Caller | Refusal:
    """The caller: a key by the cached path, a session by Django's own session and CSRF
    checks. Its rate limit is _rate_limited's, taken once a call is let through."""
    try:
        if secret is None:
            return await sync_to_async(session_caller, thread_sensitive=False)(scope=scope)
        return await routing().key_caller(secret)
    except aioredis.RedisError:
        return _redis_down()


async def _rate_limited(caller: Caller) -> Refusal | None:
    """429 when the caller's key has no request left this minute; else one is used."""
    limit = caller.key.rate_limit_per_minute if caller.key else 0
    if not limit or caller.key is None:
        return None
    try:
        allowed = await routing().take(key_id=caller.key.id, limit=limit)
    except aioredis.RedisError:
        return _redis_down()
    if allowed:
        return None
    _, retry_after = services.rate_limit_key(key_id=caller.key.id)
    return Refusal(429, f"Rate limit reached: this key may make {limit} requests per "
                   f"minute; retry in {retry_after} s.", "rate_limit_error",
                   "rate_limit_exceeded", retry_after=retry_after)


def _redis_down() -> Refusal:
    log.exception("the gateway's Redis is unreachable")
    return Refusal(503, "The gateway cannot check keys right now (Redis is unreachable); "
                   "try again shortly.", "service_unavailable", "gateway_unavailable")


async def _list_models(send: Send, caller: Caller) -> None:
    targets = models_for(caller=caller, targets=await routing().targets())
    await send_json(send, 200, {"object": "list", "data": [
        {"id": t.model, "object": "model", "created": t.created, "owned_by": "sd-appliance"}
        for t in targets]})


async def _target(caller: Caller, model: str) -> Target | Refusal:
    """The deployment serving `model`, or why not: 404 only where no deployment, active or
    ended, ever served that name (an ended one is a 503 naming its status)."""
    target = target_for(caller=caller, model=model,
                        targets=await routing().targets(model=model))
    if isinstance(target, Refusal) and target.status == 404:
        ended = await routing().ended(model=model)
        if ended is not None:
            return target_for(caller=caller, model=model, targets=[ended])
    return target


async def _generate(receive: Receive, send: Send, path: str, caller: Caller,
                    body: bytes) -> None:
    data = _parse(body)
    target: Target | Refusal = data if isinstance(data, Refusal) else \
        await _target(caller, data["model"])
    named = target
    if isinstance(target, Target):
        assert isinstance(data, dict)
        # Counted against the key's limit only once it may reach this deployment: a refused
        # call (403 out of scope, 404, 503, a bad body, a need its mode refuses) uses none.
        target = _token_refusal(data, target) or _handed_on(data, target, path)
        if isinstance(target, Target):
            target = await _rate_limited(caller) or target
    if isinstance(target, Refusal):
        await refuse(send, target)
        return
    assert isinstance(data, dict) and isinstance(named, Target)
    handed = target.group_id != named.group_id
    if handed:  # the companion's engine knows its own served name
        data = {**data, "model": target.model}
        body = json.dumps(data).encode()
    stream = bool(data.get("stream"))
    tap = UsageTap(strip=stream and not asked_usage(data))
    if tap.strip:  # the engine tells usage only when asked; the client sees no difference
        body = with_usage_option(body, data)
    if handed:  # the companion serves it: the client is told
        tap.headers = [(SERVED_BY, target.name.encode())]
    if target.simulator:  # the simulator answered, not SGLang: as the panel's banner says
        tap.headers.append(SIMULATOR)
    await relay_watching(receive, send, target, path, body, stream, tap, data)
    if not tap.started:
        return  # the engine never answered (a 503 went out): nothing to count
    # Usage is the key's, on the deployment that served it (replica 0's row for any of its
    # replicas; the companion's when the companion served): docs/gateway.md.
    await usage_writer().record(services.Usage(
        key_id=caller.key.id if caller.key else None, user_id=caller.user_id,
        deployment_id=target.group_id, prompt_tokens=tap.prompt_tokens,
        completion_tokens=tap.completion_tokens))
    await tap.finish(send)


SERVED_BY = b"x-appliance-served-by"
SIMULATOR = (b"x-appliance-simulator", b"true")  # its engine is the test engine


def _handed_on(data: dict[str, Any], target: Target, path: str) -> Target | Refusal:
    """The deployment to serve the request: the one named, or its companion when the
    named one's engine build refuses what the request needs under its speculative mode
    (appliance.engine.refusals: per build, recorded or read from its source); without a
    companion, a 400 naming the need and the fix. For a build the table does not know, a
    need some known build refused goes to the companion where there is one, else to the
    engine, whose own answer the client gets."""
    need = limitation(source=target.engine_source, algorithm=target.algorithm, body=data,
                      chat=path == "/v1/chat/completions")
    if need is None:
        return target
    if not target.companion:
        if need.assumed:
            return target
        return Refusal(400, need.message(algorithm=target.algorithm), "invalid_request_error",
                       "unsupported_by_speculative_mode", param=need.param)
    companion = routing().companion(target)
    if companion is None:
        return Refusal(503, f"This request needs what {target.algorithm} cannot give "
                       f"({need.what}), and the companion its spec names, "
                       f"{target.companion!r}, is not ready: deploy it, or wait until it is "
                       "ready.", "service_unavailable", "companion_not_ready")
    return companion
