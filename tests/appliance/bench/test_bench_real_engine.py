"""`appliance bench`'s stream reader (appliance.bench.client) on the real engine's streams.

tests/fixtures/real-engine/433c58ed7/<run>/sse_completions.txt and sse_chat.txt are the raw
bytes SGLang 433c58ed7 streamed for one /v1/completions and one /v1/chat/completions request
(max_tokens 48, include_usage), one network read a line with its arrival time, the first
line the status and headers. A local aiohttp server answers the bench's request by writing
each recorded read as one write, the recorded gap before each; the bench's own send() reads
it. Expected values are computed from the recording here.

What the recording shows (and the client must take as it is): a completions stream carries
empty-text chunks mid-stream and at the finish; the chat stream opens with a role chunk of
empty content and, with the kimi_k2 reasoning parser on, carries the text as
reasoning_content (usage says reasoning_tokens 48); the usage chunk has `choices: []`; 48
tokens come in fewer text chunks (DDTREE sends some together; many of the tiny tokenizer's
tokens decode to no text), so the token count must come from usage. No
recorded read splits an SSE event, so a second replay re-splits the same bytes every 61
bytes (made-up boundaries, stated as such) to exercise events cut across reads.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from appliance.bench.client import CHAT, COMPLETIONS, RequestResult, send, server_accept_len
from appliance.bench.prompts import Prompt
from appliance.runtime.logstream import parse_docker_ts

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "real-engine" / "433c58ed7"
SERVED = ("ddtree_triton", "dflash_triton", "base_triton")
STREAMS = {COMPLETIONS: "sse_completions.txt", CHAT: "sse_chat.txt"}
LEAD_S = 0.05  # the replay's wait before the first read (the recording has no send time)
RESPLIT = 61
# The replay's recorded gaps, measured: another worker's test on the same cores skews them
# (pytest-xdist).
pytestmark = pytest.mark.exclusive


@dataclass(frozen=True)
class Read:
    t: float  # Unix seconds of arrival
    data: bytes


def recorded(run: str, endpoint: str) -> tuple[dict[str, Any], list[Read]]:
    lines = (ROOT / run / STREAMS[endpoint]).read_text(encoding="utf-8").splitlines()
    head = json.loads(lines[0])
    reads = [json.loads(line) for line in lines[1:]]
    return head, [Read(parse_docker_ts(r["t"]) / 1e9, r["data"].encode()) for r in reads]


def events(reads: list[Read]) -> Iterator[tuple[float, dict[str, Any]]]:
    """(arrival of the read that completed it, JSON) per `data:` event, [DONE] excluded."""
    buffer = b""
    for read in reads:
        buffer += read.data
        *complete, buffer = buffer.split(b"\n\n")
        for event in complete:
            body = event.removeprefix(b"data: ")
            if body != b"[DONE]":
                yield read.t, json.loads(body)


def text_of(event: dict[str, Any]) -> str:
    choices = event["choices"]
    if not choices:
        return ""
    if "text" in choices[0]:
        return str(choices[0]["text"] or "")
    delta = choices[0]["delta"]
    return str(delta.get("content") or delta.get("reasoning_content") or "")


@dataclass(frozen=True)
class Expected:
    text: str
    chunks: int
    itl: list[float]
    ttft: float  # from the replay's first write
    usage: dict[str, Any]


def expected(reads: list[Read]) -> Expected:
    carrying = [(t, text_of(e)) for t, e in events(reads) if text_of(e)]
    usage = [e["usage"] for _, e in events(reads) if e.get("usage")]
    assert len(usage) == 1  # one usage chunk, the last before [DONE]
    times = [t for t, _ in carrying]
    return Expected("".join(text for _, text in carrying), len(carrying),
                    [b - a for a, b in zip(times, times[1:], strict=False)],
                    LEAD_S + times[0] - reads[0].t, usage[0])


# ---------------------------------------------------------------- the replaying server

def resplit(reads: list[Read]) -> list[Read]:
    """The same bytes in RESPLIT-byte pieces, 1 ms apart (made-up read boundaries)."""
    data = b"".join(r.data for r in reads)
    return [Read(reads[0].t + i * 0.001, data[i * RESPLIT:(i + 1) * RESPLIT])
            for i in range((len(data) + RESPLIT - 1) // RESPLIT)]


# How late the replay wrote its reads, at most, per endpoint (s): what the machine's load
# added to the recorded gaps on the server's side of the one event loop.
LATE: dict[str, float] = {}


@asynccontextmanager
async def replaying(run: str, reads: dict[str, list[Read]]) -> AsyncIterator[str]:
    async def stream(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        await request.read()
        head, _ = recorded(run, request.path)
        mine = reads[request.path]
        response = web.StreamResponse(status=head["status"], headers={
            "Content-Type": head["headers"]["content-type"]})
        await response.prepare(request)
        previous = mine[0].t - LEAD_S
        LATE[request.path] = 0.0
        for read in mine:
            await asyncio.sleep(max(0.0, read.t - previous))
            await response.write(read.data)
            previous = read.t
            due = arrived + read.t - (mine[0].t - LEAD_S)
            LATE[request.path] = max(LATE[request.path], time.perf_counter() - due)
        await response.write_eof()
        return response

    async def info(request: web.Request) -> web.Response:
        return web.Response(text=(ROOT / run / "server_info.json").read_text(),
                            content_type="application/json")

    app = web.Application()
    app.router.add_post(COMPLETIONS, stream)
    app.router.add_post(CHAT, stream)
    app.router.add_get("/server_info", info)
    app.router.add_get("/get_server_info", info)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()


async def bench_one(run: str, endpoint: str, reads: list[Read]) -> RequestResult:
    async with replaying(run, {endpoint: reads}) as url, aiohttp.ClientSession() as session:
        return await send(session, url, endpoint, "/root/stash/models/tiny-kimi",
                          Prompt(text="recorded", input_len=0, output_len=48))


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("run", SERVED)
def test_the_bench_reads_the_real_stream_at_its_recorded_read_boundaries(
        run: str, endpoint: str) -> None:
    head, reads = recorded(run, endpoint)
    assert head["status"] == 200 and all(r.data.endswith(b"\n\n") for r in reads)
    want = expected(reads)
    result = asyncio.run(bench_one(run, endpoint, reads))
    assert result.ok and result.error == ""
    assert result.text == want.text and len(result.itl) == want.chunks - 1
    assert (result.output_len, result.input_len, result.token_source) == (
        want.usage["completion_tokens"], want.usage["prompt_tokens"], "usage")
    assert result.output_len == 48
    # Timing: the replay keeps the recorded gaps; the client never measures one shorter,
    # and in all no more than 25 % + 50 ms longer than the replay wrote them (a shared
    # 2-core machine's scheduling; how late the replay itself wrote is LATE's).
    late = LATE[endpoint]
    assert want.ttft - 0.002 <= result.ttft <= want.ttft + late + 0.25, late
    for got, gap in zip(result.itl, want.itl, strict=True):
        assert got >= gap - 0.002
    assert sum(result.itl) <= 1.25 * sum(want.itl) + late + 0.05, late
    assert result.latency >= result.ttft + sum(result.itl)


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("run", SERVED)
def test_events_cut_across_reads_give_the_same_answer(run: str, endpoint: str) -> None:
    _, reads = recorded(run, endpoint)
    pieces = resplit(reads)
    assert any(not p.data.endswith(b"\n\n") for p in pieces)
    want = expected(reads)
    result = asyncio.run(bench_one(run, endpoint, pieces))
    assert result.ok and result.text == want.text
    assert len(result.itl) + 1 == want.chunks
    assert result.output_len == want.usage["completion_tokens"] == 48


def test_chunks_are_not_tokens_so_the_count_comes_from_usage() -> None:
    """48 tokens each, but not 48 chunks: DDTREE (accept length about 1.1) sends some tokens
    together, and many tokens of the tiny tokenizer decode to no text at all."""
    def steps(run: str) -> int:
        return sum(1 for _, e in events(recorded(run, COMPLETIONS)[1])
                   if e["choices"] and e["choices"][0]["finish_reason"] is None)

    assert steps("ddtree_triton") < steps("dflash_triton") == steps("base_triton") < 48
    for run in SERVED:
        want = expected(recorded(run, COMPLETIONS)[1])
        assert want.chunks < want.usage["completion_tokens"] == 48, run


@pytest.mark.parametrize("run", SERVED)
def test_the_recorded_server_info_carries_no_accept_length_and_the_bench_says_none(
        run: str) -> None:
    """server_info.json was read after the warm-up request, before any served decode; the
    engine reports avg_spec_accept_length in internal_states[0] only later (bench.json holds
    what the bench read after each level: 1.10-1.115 DDTREE, 1.0 DFLASH, none without
    speculation)."""
    info = json.loads((ROOT / run / "server_info.json").read_text())
    assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
    assert "avg_spec_accept_length" not in info["internal_states"][0]

    async def read() -> float | None:
        async with replaying(run, {}) as url, aiohttp.ClientSession() as session:
            return await server_accept_len(session, url)

    assert asyncio.run(read()) is None
    levels = json.loads((ROOT / run / "bench.json").read_text())
    read_then = [lv["json"]["levels"][0]["accept_len"] for lv in levels]
    if run == "base_triton":
        assert read_then == [None, None, None]
    else:
        assert all(isinstance(v, float) and 1.0 <= v < 1.2 for v in read_then)
