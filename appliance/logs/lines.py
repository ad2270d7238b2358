"""Classify one line of SGLang engine output: phase, progress, stats and self-check events.

Formats come from SGLang's own source (0.4.6, 0.5.11 and 0.5.23 wheels):
- log prefix `[%(asctime)s{.msecs}{ DPn}{ PPn}{ ATTN_CPn}{ MOE_DPn}{ TPn}{ EPn}] `
  (utils/common.py configure_logger, managers/scheduler.py logger prefix);
- `Load weight begin/end` (model_executor/model_runner.py load_model);
- `KV Cache is allocated` (mem_cache/memory_pool.py);
- `Capture cuda graph begin/end` (old model_runner.init_device_graphs) and
  `Capture {role} {mode} CUDA graph begin/end` (0.5.23
  model_runner_components/cuda_graph_setup.py, speculative/eagle_worker_v2.py);
- `Capturing batches (bs=.. avail_mem=.. GB)` tqdm (cuda_graph_runner capture);
- `Decode batch` / `Prefill batch` (scheduler_metrics_mixin / metrics_reporter).

Before SGLang starts, the engine image's entrypoint may run the GPU self-check: its
`appliance: GPU self-check begin|end rc=N` lines and appliance.selfcheck's `--stream`
lines (`gpu-check: {json}`) become selfcheck_* events, and a failed check a diagnosis.

Every container output line passes through `classify` (from LogParser.feed), so the
per-line path is a handful of `startswith`/`in` checks before any regex. What each kind
carries is appliance.events' (WeightsBegin, CaptureProgress, ...): the fields built here
are checked against those types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from appliance import selfcheck
from appliance.events import (
    BAR_KINDS,
    CAPTURE_BEGIN,
    CAPTURE_BS,
    CAPTURE_END,
    CAPTURE_PROGRESS,
    DECODE_STATS,
    KV_CACHE,
    PREFILL_STATS,
    READY,
    SELFCHECK_EXIT,
    SELFCHECK_START,
    SERVER_ARGS,
    WEIGHTS_BEGIN,
    WEIGHTS_END,
    WEIGHTS_PROGRESS,
    CaptureBegin,
    CaptureBs,
    CaptureEnd,
    CaptureProgress,
    DecodeStats,
    KvCache,
    PrefillStats,
    WeightsBegin,
    WeightsEnd,
    WeightsProgress,
)
from appliance.logs.facts import SERVER_ARGS_PREFIX, server_args_facts

TRACEBACK_START = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
# After the exception line some errors carry extra lines (SGLang's
# "Possible solutions:" list, NCCL's "Last error:"). Keep a few, not a flood.
MAX_CONTINUATION_LINES = 12
MAX_TRACEBACK_LINES = 400
PROGRESS_KINDS = BAR_KINDS  # a redrawn tqdm bar's kinds (appliance.events)

_AVAIL_MEM = re.compile(r"avail[ _]mem=([\d.]+) ?GB")
_MEM_USAGE = re.compile(r"mem usage=([\d.]+) GB")
_ELAPSED = re.compile(r"(?:elapsed=|Time elapsed: |capture in )([\d.]+) s")
_LOAD_TYPE = re.compile(r"type=([\w.]+)")
_QUANT = re.compile(r"quant=([\w-]+)")
_DTYPE = re.compile(r"dtype[=:] ?([\w.]+)")
_TOKENS = re.compile(r"#tokens: (\d+)")
_SIZE = re.compile(r"\b(K|V|KV) size: ([\d.]+) GB")
_CAPTURE = re.compile(
    r"^Capture (?:(?P<name>.+?) )?(?:CUDA|cuda|CPU|cpu|NPU|npu|XPU|xpu|MUSA|musa) graph "
    r"(?P<event>begin|end)\b"
)
_OLD_CAPTURE_BS = re.compile(r"^Capture cuda graph bs (\[[\d, ]*\])")
_NUM_TOKENS_PER_REQ = re.compile(r"num_tokens_per_req=(\d+)")
_BACKEND = re.compile(r"backend=([\w.-]+)")
_BS_LIST = re.compile(r"\bbs=\[([\d, ]*)\]")
_CAPTURING = re.compile(r"Capturing batches \(bs=(\d+) avail_mem=([\d.]+) GB\)")
_TQDM_COUNT = re.compile(r"\| *(\d+)/(\d+) \[")
_RANK = re.compile(r"^([A-Z_]+?)(\d+)$")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]:? ?")
SELFCHECK_BEGIN = "appliance: GPU self-check begin"
_SELFCHECK_END = re.compile(r"^appliance: GPU self-check end rc=(-?\d+)")

# "Decode batch" key -> (event field, converter). The token pool keys vary
# with the pool (plain, hybrid SWA, mamba, hisparse): the first wins.
_INT_KEYS = {
    "#running-req": "running_req",
    "#token": "tokens",
    "#full token": "tokens",
    "#queue-req": "queue_req",
    "#new-seq": "new_seq",
    "#new-token": "new_token",
    "#cached-token": "cached_token",
    "#pending-token": "pending_token",
}
_FLOAT_KEYS = {
    "token usage": "token_usage",
    "full token usage": "token_usage",
    "accept len": "accept_len",
    "accept rate": "accept_rate",
    "gen throughput (token/s)": "gen_throughput",
    "input throughput (token/s)": "input_throughput",
}
_GRAPH_KEYS = frozenset({"cuda graph", "cpu graph", "npu graph", "musa graph"})
DECODE_FIELDS = (
    "running_req",
    "tokens",
    "token_usage",
    "accept_len",
    "accept_rate",
    "cuda_graph",
    "gen_throughput",
    "queue_req",
)
PREFILL_FIELDS = (
    "new_seq",
    "new_token",
    "cached_token",
    "token_usage",
    "running_req",
    "queue_req",
    "pending_token",
    "cuda_graph",
    "input_throughput",
)


# The ranks of a prefix's tail (`TP0`, `DP1 TP3 EP3`): a busy engine repeats a handful.
_RANKS_OF: dict[str, dict[str, int]] = {}


def _ranks_of(head: str) -> dict[str, int]:
    """The ranks named after the date and time in a prefix (a new dict: callers keep it)."""
    parts = head.split(" ", 2)
    if len(parts) < 3:
        return {}
    found = _RANKS_OF.get(parts[2])
    if found is None:
        found = {}
        for token in parts[2].split(" "):
            match = _RANK.match(token)
            if match:
                found[match.group(1).lower()] = int(match.group(2))
        if len(_RANKS_OF) < 4096:
            _RANKS_OF[parts[2]] = found
    return dict(found)


def split_prefix(text: str) -> tuple[str, dict[str, int]]:
    """Strip `[date time RANKS] ` (and torch's `[rankN]: `); return the message and ranks."""
    if text[:1] == "[" and text[1:3].isdigit() and len(text) >= 21:
        close = text.find("] ", 20)  # the common case first: an SGLang record
        if close > 0:
            return text[close + 2 :], _ranks_of(text[1:close])
    ranks: dict[str, int] = {}
    if text.startswith("[rank"):
        match = _TORCH_RANK.match(text)
        if match:
            ranks["rank"] = int(match.group(1))
            text = text[match.end() :]
    if text.startswith("(") and " pid=" in text[:80]:
        # Ray actors prefix their output with "(SchedulerActor pid=123, ip=...) ".
        close = text.find(") ")
        if close > 0:
            text = text[close + 2 :]
    if not text.startswith("[") or len(text) < 21 or not text[1:3].isdigit():
        return text, ranks
    close = text.find("] ", 20)
    if close < 0:
        return text, ranks
    return text[close + 2 :], {**ranks, **_ranks_of(text[1:close])}


def _float(pattern: re.Pattern[str], text: str) -> float | None:
    match = pattern.search(text)
    return float(match.group(1)) if match else None


def _int_list(text: str) -> list[int]:
    return [int(item) for item in text.replace(" ", "").split(",") if item]


def parse_stats(message: str) -> dict[str, Any]:
    """Parse the `key: value, ` pairs of a Decode/Prefill batch line."""
    out: dict[str, Any] = {}
    for part in message.split(", "):
        key, sep, value = part.partition(": ")
        if not sep:
            continue
        value = value.rstrip(", ")
        try:
            if key in _INT_KEYS:
                out.setdefault(_INT_KEYS[key], int(value))
            elif key in _FLOAT_KEYS:
                out.setdefault(_FLOAT_KEYS[key], float(value))
            elif key in _GRAPH_KEYS:
                out["cuda_graph"] = value == "True"
        except ValueError:
            continue  # a field this parser does not know the shape of
    return out


def _stats_body(message: str, head: str) -> str:
    """Drop `Decode batch`, an optional ` [iter]` and the `, ` or `. ` (0.4.x) after it."""
    rest = message[len(head) :]
    if rest.startswith(" ["):
        rest = rest[rest.find("]") + 1 :]
    return rest[2:]


def _capture_event(match: re.Match[str],
                   message: str) -> tuple[str, CaptureBegin | CaptureEnd]:
    words = (match.group("name") or "").split()
    role = next((w for w in words if w in ("target", "draft")), None)
    rest = [w for w in words if w != role]
    mode = " ".join(rest) if rest else None
    bs_match = _BS_LIST.search(message)
    bs = _int_list(bs_match.group(1)) if bs_match else None
    if match.group("event") == "begin":
        width = _NUM_TOKENS_PER_REQ.search(message)
        backend = _BACKEND.search(message)
        begin: CaptureBegin = {
            "role": role,
            "mode": mode,
            "num_tokens_per_req": int(width.group(1)) if width else None,
            "backend": backend.group(1) if backend else None,
            "avail_mem_gb": _float(_AVAIL_MEM, message),
        }
        # Newer SGLang (the DFlash v2 runtime) lists the batch sizes on the begin line.
        if bs is not None:
            begin["bs"] = bs
        return CAPTURE_BEGIN, begin
    return CAPTURE_END, {
        "role": role,
        "mode": mode,
        "elapsed_s": _float(_ELAPSED, message),
        "bs": bs,
        "mem_usage_gb": _float(_MEM_USAGE, message),
        "avail_mem_gb": _float(_AVAIL_MEM, message),
    }


# SGLang's decode line as 0.5.x prints it, with or without the speculative fields: a
# busy engine prints thousands a second, and one match is a third of the general parse.
# Anything else (another version's keys, a value of another shape) takes parse_stats;
# tests/appliance/logs/test_logparse.py holds both to the same answer on the recordings.
_DECODE_LINE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+), token usage: (\d+\.\d+), "
    r"(?:accept len: (\d+\.\d+), accept rate: (\d+\.\d+), )?cuda graph: (True|False), "
    r"gen throughput \(token/s\): (\d+\.\d+), #queue-req: (\d+)$")


def decode_stats_fast(message: str) -> DecodeStats | None:
    """The decode_stats fields of an SGLang 0.5.x decode line; None for any other shape."""
    match = _DECODE_LINE.match(message)
    if match is None:
        return None
    running, tokens, usage, accept_len, accept_rate, graph, gen, queue = match.groups()
    return {"running_req": int(running), "tokens": int(tokens), "token_usage": float(usage),
            "accept_len": float(accept_len) if accept_len is not None else None,
            "accept_rate": float(accept_rate) if accept_rate is not None else None,
            "cuda_graph": graph == "True", "gen_throughput": float(gen),
            "queue_req": int(queue)}


def decode_stats(message: str) -> DecodeStats:
    """The decode_stats fields of any version's decode line (the general parse)."""
    stats = parse_stats(_stats_body(message, "Decode batch"))
    return cast(DecodeStats, {name: stats.get(name) for name in DECODE_FIELDS})


def classify(message: str) -> tuple[str, Mapping[str, Any]] | None:
    """One log message (prefix already stripped) -> (kind, fields), or None; the fields of
    each kind are appliance.events' type of that name."""
    first = message[:1]
    if first == "D" and message.startswith("Decode batch"):
        return DECODE_STATS, decode_stats_fast(message) or decode_stats(message)
    if first == "P" and message.startswith("Prefill batch"):
        stats = parse_stats(_stats_body(message, "Prefill batch"))
        return PREFILL_STATS, cast(PrefillStats,
                                     {name: stats.get(name) for name in PREFILL_FIELDS})
    if first == "C":
        return _classify_capture(message)
    if first in ("g", "a"):
        return _classify_selfcheck(message)
    if first in ("L", "M"):
        return _classify_load(message)
    if first == "s" and message.startswith(SERVER_ARGS_PREFIX):
        return SERVER_ARGS, server_args_facts(message)
    if "KV Cache is allocated" in message or "KV cache allocated" in message:
        return _kv_cache(message)
    if "ready to roll" in message and "fired up" in message:
        return READY, {}
    return None


def _classify_capture(
        message: str) -> tuple[str, CaptureProgress | CaptureBegin | CaptureEnd | CaptureBs] | None:
    if message.startswith("Capturing batches"):
        match = _CAPTURING.search(message)
        count = _TQDM_COUNT.search(message)
        if not match:
            return None
        return CAPTURE_PROGRESS, {
            "bs": int(match.group(1)),
            "done": int(count.group(1)) if count else None,
            "total": int(count.group(2)) if count else None,
            "avail_mem_gb": float(match.group(2)),
        }
    if not message.startswith("Capture ") or "failed" in message:
        return None
    match = _CAPTURE.match(message)
    if match:
        return _capture_event(match, message)
    old_bs = _OLD_CAPTURE_BS.match(message)
    if old_bs:
        return CAPTURE_BS, {"bs": _int_list(old_bs.group(1)[1:-1])}
    return None


def _classify_selfcheck(message: str) -> tuple[str, Mapping[str, Any]] | None:
    if message.startswith(selfcheck.STREAM_PREFIX):
        event = selfcheck.parse_stream_line(message)
        if event is None:
            return None
        kind = str(event.pop("event"))
        return f"selfcheck_{kind}", event
    if message.startswith(SELFCHECK_BEGIN):
        return SELFCHECK_START, {}
    match = _SELFCHECK_END.match(message)
    if match:
        return SELFCHECK_EXIT, {"rc": int(match.group(1))}
    return None


def _classify_load(
        message: str) -> tuple[str, WeightsBegin | WeightsEnd | WeightsProgress] | None:
    if message.startswith("Load weight begin"):
        return WEIGHTS_BEGIN, {"avail_mem_gb": _float(_AVAIL_MEM, message)}
    if message.startswith("Load weight end"):
        model_type = _LOAD_TYPE.search(message)
        quant = _QUANT.search(message)
        return WEIGHTS_END, {
            "elapsed_s": _float(_ELAPSED, message),
            "mem_usage_gb": _float(_MEM_USAGE, message),
            "avail_mem_gb": _float(_AVAIL_MEM, message),
            "model_type": model_type.group(1) if model_type else None,
            "quant": quant.group(1) if quant else None,
        }
    # "Loading safetensors checkpoint shards" (0.5.23); 433c58ed7 prints "Multi-thread
    # loading shards: 100% Completed | 1/1 [...]" (tests/fixtures/real-engine).
    if message.startswith(("Loading ", "Multi-thread loading")) and "shards" in message:
        count = _TQDM_COUNT.search(message)
        if count:
            return WEIGHTS_PROGRESS, {"done": int(count.group(1)), "total": int(count.group(2))}
    return None


def _kv_cache(message: str) -> tuple[str, KvCache] | None:
    tokens = _TOKENS.search(message)
    if not tokens:
        return None
    sizes = {name: float(value) for name, value in _SIZE.findall(message)}
    dtype = _DTYPE.search(message)
    return KV_CACHE, {
        "tokens": int(tokens.group(1)),
        "k_size_gb": sizes.get("K"),
        "v_size_gb": sizes.get("V"),
        "kv_size_gb": sizes.get("KV"),
        "dtype": dtype.group(1) if dtype else None,
        "draft": "draft" in message.split("KV", 1)[0].lower(),
    }
