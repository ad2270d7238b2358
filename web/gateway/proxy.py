"""The gateway's data plane: a thin ASGI pass-through in the panel's own uvicorn process.

Only /v1/models, /v1/chat/completions and /v1/completions exist; everything else under /v1
is a 404 here and never reaches an engine (SGLang's admin and internal routes, /generate,
/flush_cache, /load_lora_adapter_from_tensors, /server_info, /metrics, stay unreachable).
Streams pass through as the engine wrote them, event by event, in order; the engine's own
usage (the body's `usage`, or a stream's last chunk) is counted per key and deployment.
docs/gateway.md says why this and not sglang-router, with the measured overhead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
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
from web.gateway.routing import routing
from web.gateway.selectors import Target
from web.gateway.upstream import (
    CONNECT_TIMEOUT_S,
    Bounds,
    Response,
    UpstreamError,
    UpstreamTimeout,
    pool,
)
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


# ------------------------------------------------------------------ responses

async def _send_json(send: Send, status: int, body: Any,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _refuse(send: Send, refusal: Refusal) -> None:
    extra = ([(b"retry-after", str(refusal.retry_after).encode())]
             if refusal.retry_after is not None else [])
    if refusal.status == 401:
        extra.append((b"www-authenticate", b'Bearer realm="sd-appliance"'))
    await _send_json(send, refusal.status, refusal.body(), extra)


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
        await _refuse(send, Refusal(404, f"Unknown URL {path}: the gateway serves only "
                                    f"{', '.join(sorted(ROUTES))}.", "invalid_request_error",
                                    "unknown_url"))
        return
    if method != ROUTES[path]:
        await _refuse(send, Refusal(405, f"{path} takes {ROUTES[path]}, not {method}.",
                                    "invalid_request_error", "method_not_allowed"))
        return
    secret, cookie = _credentials(scope)
    if secret is None and not cookie:
        await _refuse(send, NO_CREDENTIALS)  # no database work for an anonymous call
        return
    # The key first: a caller the gateway refuses has none of its body read or parsed.
    caller = await _caller(scope, secret)
    if isinstance(caller, Refusal):
        await _refuse(send, caller)
        return
    if path == "/v1/models":
        refusal = await _rate_limited(caller)
        if refusal is not None:
            await _refuse(send, refusal)
            return
        await _list_models(send, caller)
        return
    body = await _read_body(receive)
    if body is None:
        await _refuse(send, Refusal(413, "The request body is over the gateway's limit "
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
    await _send_json(send, 200, {"object": "list", "data": [
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
        await _refuse(send, target)
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
    await _relay_watching(receive, send, target, path, body, stream, tap, data)
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
REPLICA = b"x-appliance-replica"  # the replica (its index) that answered, or began a stream
SIMULATOR = (b"x-appliance-simulator", b"true")  # its engine is the test engine
RETRIED = (b"x-appliance-retried", b"1")  # another replica failed it before answering


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


# ------------------------------------------------------------------ relaying

async def _relay_watching(receive: Receive, send: Send, target: Target, path: str,
                          body: bytes, stream: bool, tap: UsageTap,
                          data: dict[str, Any]) -> None:
    """Relay, and stop the engine's work as soon as the client goes away.

    The relay runs in the request's own task; a watcher of the client's disconnect cancels
    it. (A task of its own for the relay and `asyncio.wait` on the two cost a task, a
    waiter and four callbacks per request, on the path whose added p99 docs/gateway.md bounds.)"""
    relaying = asyncio.current_task()
    assert relaying is not None
    watching = True  # the watcher cancels the relay only while it runs
    stopped = False  # ... and says so: any other cancel is the server's, and goes on up

    def client_gone(watcher: asyncio.Future[None]) -> None:
        nonlocal stopped
        if watching and not watcher.cancelled() and watcher.exception() is None:
            stopped = True
            relaying.cancel()

    gone = asyncio.ensure_future(_disconnected(receive))
    gone.add_done_callback(client_gone)
    try:
        await _relay(send, target, path, body, stream, tap, data)
    except asyncio.CancelledError:
        if not stopped:
            raise  # cancelled from outside (the server shutting down), not by the watcher
        relaying.uncancel()  # the client went away: the relay was stopped, nothing more
    finally:
        watching = False
        if not gone.done():
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _relay(send: Send, target: Target, path: str, body: bytes, stream: bool,
                 tap: UsageTap, data: dict[str, Any]) -> None:
    """To one replica of the deployment; once more to another when the first failed before
    answering (refused, reset, a 502/503, a stream broken before its first event, nothing
    within the first-byte timeout: web/gateway/upstream.py's Bounds)."""
    table = routing()
    rows = table.rotation(target)
    if not rows:
        await _refuse(send, Refusal(503, f"Every replica of {target.model!r} is draining (a "
                                    "rolling change is under way); try again shortly.",
                                    "service_unavailable", "deployment_draining"))
        return
    affinity = _affinity(data) if len(rows) > 1 else None
    tried: tuple[int, ...] = ()
    while rows:
        row = table.pick(rows, affinity=affinity)
        tried += (row.deployment_id,)
        # The one retry is owed whenever another row serves, not only when the rotation
        # offered one: a row left out of it (its host's heartbeat late, a failure of its own
        # not yet cleared by /health) is still a better answer than a 503.
        retry = len(tried) == 1 and any(t.deployment_id != row.deployment_id
                                        for t in table.serving(target))
        tap.replica = row.replica_index
        table.begin(row)
        try:
            answered = await _relay_to(send, row, path, body, stream, tap, retry)
        finally:
            table.end(row)
        if answered:
            if tap.failure is not None:  # its stream broke off midway: out until it is back
                table.eject(row, generate=isinstance(tap.failure, UpstreamTimeout))
            return
        # A replica that timed out may be one whose HTTP server answers while its engine
        # does not: it comes back only once it makes a token again.
        table.eject(row, generate=isinstance(tap.failure, UpstreamTimeout))
        if not retry:
            break
        rows = table.rotation(target, exclude=tried, away_from=row.host_key)
        if not tap.started:  # said on the answer: it came from a second replica
            tap.headers.append(RETRIED)
    timed_out = isinstance(tap.failure, UpstreamTimeout)
    if tap.started:  # a stream's head went out, no event: it ends as a broken one
        tap.broken(_stream_timed_out(tap.failure) if timed_out else STREAM_BROKEN)
    elif timed_out:
        await _refuse(send, Refusal(504, f"The deployment's engine did not answer: "
                                    f"{tap.failure}. Try again shortly.", "engine_error",
                                    "engine_timeout"))
    else:
        await _refuse(send, Refusal(503, "The deployment's engine did not answer; it may be "
                                    "restarting. Try again shortly.", "service_unavailable",
                                    "engine_unreachable"))


# A replica that gives one of these before any byte of an answer is tried no more for this
# request: it is going away (SGLang answers 503 while it shuts down or its scheduler is gone).
RETRIED_STATUSES = frozenset({502, 503})
FAILOVER_CONNECT_S = 2.0  # connecting, when another replica could take the request instead
AFFINITY_BLOCK = 256  # characters: the first block of a prompt, about 64 tokens


def _affinity(data: dict[str, Any]) -> int | None:
    """A hash of the prompt's first block (the completion's prompt, the chat's first
    message), the same in every panel process; None when there is no text to hash."""
    text = data.get("prompt")
    if not isinstance(text, str):
        messages = data.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        text = first.get("content") if isinstance(first, dict) else None
        if not isinstance(text, str):
            return None
    return zlib.crc32(text[:AFFINITY_BLOCK].encode("utf-8", "surrogatepass"))


async def _relay_to(send: Send, row: Target, path: str, body: bytes, stream: bool,
                    tap: UsageTap, retry: bool) -> bool:
    """Relay from one row's engine; False when it failed before answering (nothing of it
    reached the client) and `retry` says another replica may take the request."""
    url = row.engine_url.rstrip("/") + path
    timeout_s = FAILOVER_CONNECT_S if retry else CONNECT_TIMEOUT_S
    tap.failure = None
    try:
        auth = f"Bearer {row.engine_key}" if row.engine_key else ""
        async with pool().post(url, body, authorization=auth, connect_timeout_s=timeout_s,
                               bounds=_bounds(row, stream)) as upstream:
            if retry and upstream.status in RETRIED_STATUSES:
                log.warning("engine %s answered %s before any byte: another replica takes it",
                            row.engine_url, upstream.status)
                return False
            kind = upstream.headers.get("content-type", "application/json").encode()
            if stream and upstream.status == 200:
                return await _relay_stream(send, upstream, kind, tap, retry)
            if tap.started:  # a retry after a stream's head went out: no second status
                await upstream.read()
                tap.broken(STREAM_BROKEN)
                return True
            await _relay_whole(send, upstream, kind, tap)
            return True
    except UpstreamError as exc:
        log.warning("engine %s unreachable: %s", row.engine_url, exc)
        tap.failure = exc
        return False


def _bounds(row: Target, stream: bool) -> Bounds:
    """The wait allowed on the engine (settings, docs/gateway.md "Bounded waits"): a
    stream's first event within the first-byte timeout, then silences within the idle one;
    a whole answer past the first-byte timeout only while the engine's /health answers, to
    the whole-answer timeout."""
    first, idle = settings.GATEWAY_FIRST_BYTE_TIMEOUT_S, settings.GATEWAY_IDLE_STREAM_TIMEOUT_S
    if stream:
        return Bounds(first_byte_s=first, idle_s=idle)
    return Bounds(first_byte_s=first, idle_s=idle,
                  health_url=row.engine_url.rstrip("/") + "/health",
                  whole_s=max(first, settings.GATEWAY_WHOLE_ANSWER_TIMEOUT_S))


async def _relay_stream(send: Send, upstream: Response, kind: bytes,
                        tap: UsageTap, retry: bool = False) -> bool:
    if not tap.started:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", kind), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *tap.headers,
            (REPLICA, str(tap.replica).encode())]})
        tap.started = True
    try:
        async for data in upstream.chunks():
            out = tap.feed(data)
            if out:
                tap.sent_body = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except UpstreamError as exc:
        if not tap.sent_body:  # nothing of it reached the client: another may take it
            log.warning("engine stream broken off before its first event: %s", exc)
            tap.restart()
            tap.failure = exc
            if retry:
                return False
            tap.broken(_stream_timed_out(exc) if isinstance(exc, UpstreamTimeout)
                       else STREAM_BROKEN)
            return True
        log.warning("engine stream broken off: %s", exc)
        tap.failure = exc
        tap.broken(_stream_timed_out(exc) if isinstance(exc, UpstreamTimeout)
                   else STREAM_BROKEN)
        return True
    if not tap.done:  # ended cleanly, but short of its [DONE]: the engine stopped early
        if retry and not tap.sent_body:
            tap.restart()
            return False
        log.warning("engine stream ended without [DONE]")
        tap.broken(STREAM_BROKEN)
    # the end (any unterminated tail) goes out in tap.finish, after usage is recorded
    return True


STREAM_BROKEN = Refusal(502, "The deployment's engine stopped in the middle of this answer "
                        "(it may have crashed or be restarting): the text above is "
                        "incomplete. Try again shortly.", "engine_error", "engine_stream_broken")


def _stream_timed_out(error: UpstreamError | None) -> Refusal:
    """A stream's end when its engine went silent past the gateway's bound (the error event
    names which), so the client raises instead of waiting without end."""
    return Refusal(504, f"The deployment's engine stopped answering: {error}. The text "
                   "above (if any) is incomplete. Try again shortly.", "engine_error",
                   "engine_timeout")


async def _relay_whole(send: Send, upstream: Response, kind: bytes,
                       tap: UsageTap) -> None:
    data = await upstream.read()
    if upstream.status == 200:
        with contextlib.suppress(ValueError, AttributeError):
            tap.take_usage(json.loads(data).get("usage"))
    await send({"type": "http.response.start", "status": upstream.status, "headers": [
        (b"content-type", kind), (b"content-length", str(len(data)).encode()),
        *tap.headers, (REPLICA, str(tap.replica).encode())]})
    tap.started = True
    tap.hold(data)  # sent by tap.finish, once usage is recorded
