"""Turn SGLang engine output into phase, progress, stats and error events.

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

The worker feeds every container output line through `LogParser.feed`, so the
per-line path is a handful of `startswith`/`in` checks before any regex.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from appliance.logs import diagnosis as diag
from appliance import selfcheck

TRACEBACK_START = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
# After the exception line some errors carry extra lines (SGLang's
# "Possible solutions:" list, NCCL's "Last error:"). Keep a few, not a flood.
MAX_CONTINUATION_LINES = 12
MAX_TRACEBACK_LINES = 400
PROGRESS_KINDS = frozenset({"weights_progress", "capture_progress"})

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


@dataclass
class LogEvent:
    line: int
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "kind": self.kind, **self.fields}


@dataclass
class _Pending:
    """A Python traceback being collected across lines."""

    line: int
    ranks: dict[str, int]
    lines: list[str]
    message: str | None = None
    continuation: int = 0


@dataclass
class ParseContext:
    """What the log has said so far; diagnoses need it (widths, batch sizes, phase)."""

    phase: str = "starting"
    speculative: bool = False
    verify_width: int | None = None
    draft_width: int | None = None
    capture_bs: list[int] | None = None
    last_bs: int | None = None
    max_running_req: int = 0
    selfcheck_reported: bool = False


def split_prefix(text: str) -> tuple[str, dict[str, int]]:
    """Strip `[date time RANKS] ` (and torch's `[rankN]: `); return the message and ranks."""
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
    head = text[1:close].split(" ")
    for token in head[2:]:
        match = _RANK.match(token)
        if match:
            ranks[match.group(1).lower()] = int(match.group(2))
    return text[close + 2 :], ranks


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


def _capture_event(match: re.Match[str], message: str) -> tuple[str, dict[str, Any]]:
    words = (match.group("name") or "").split()
    role = next((w for w in words if w in ("target", "draft")), None)
    rest = [w for w in words if w != role]
    mode = " ".join(rest) if rest else None
    bs_match = _BS_LIST.search(message)
    bs = _int_list(bs_match.group(1)) if bs_match else None
    common: dict[str, Any] = {"role": role, "mode": mode}
    if match.group("event") == "begin":
        width = _NUM_TOKENS_PER_REQ.search(message)
        backend = _BACKEND.search(message)
        return "capture_begin", {
            **common,
            "num_tokens_per_req": int(width.group(1)) if width else None,
            "backend": backend.group(1) if backend else None,
            "avail_mem_gb": _float(_AVAIL_MEM, message),
        }
    return "capture_end", {
        **common,
        "elapsed_s": _float(_ELAPSED, message),
        "bs": bs,
        "mem_usage_gb": _float(_MEM_USAGE, message),
        "avail_mem_gb": _float(_AVAIL_MEM, message),
    }


def classify(message: str) -> tuple[str, dict[str, Any]] | None:
    """One log message (prefix already stripped) -> (kind, fields), or None."""
    first = message[:1]
    if first == "D" and message.startswith("Decode batch"):
        stats = parse_stats(_stats_body(message, "Decode batch"))
        return "decode_stats", {name: stats.get(name) for name in DECODE_FIELDS}
    if first == "P" and message.startswith("Prefill batch"):
        stats = parse_stats(_stats_body(message, "Prefill batch"))
        return "prefill_stats", {name: stats.get(name) for name in PREFILL_FIELDS}
    if first == "C":
        return _classify_capture(message)
    if first in ("g", "a"):
        return _classify_selfcheck(message)
    if first == "L":
        return _classify_load(message)
    if "KV Cache is allocated" in message or "KV cache allocated" in message:
        return _kv_cache(message)
    if "ready to roll" in message and "fired up" in message:
        return "ready", {}
    return None


def _classify_capture(message: str) -> tuple[str, dict[str, Any]] | None:
    if message.startswith("Capturing batches"):
        match = _CAPTURING.search(message)
        count = _TQDM_COUNT.search(message)
        if not match:
            return None
        return "capture_progress", {
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
        return "capture_bs", {"bs": _int_list(old_bs.group(1)[1:-1])}
    return None


def _classify_selfcheck(message: str) -> tuple[str, dict[str, Any]] | None:
    if message.startswith(selfcheck.STREAM_PREFIX):
        event = selfcheck.parse_stream_line(message)
        if event is None:
            return None
        kind = str(event.pop("event"))
        return f"selfcheck_{kind}", event
    if message.startswith(SELFCHECK_BEGIN):
        return "selfcheck_start", {}
    match = _SELFCHECK_END.match(message)
    if match:
        return "selfcheck_exit", {"rc": int(match.group(1))}
    return None


def _classify_load(message: str) -> tuple[str, dict[str, Any]] | None:
    if message.startswith("Load weight begin"):
        return "weights_begin", {"avail_mem_gb": _float(_AVAIL_MEM, message)}
    if message.startswith("Load weight end"):
        model_type = _LOAD_TYPE.search(message)
        quant = _QUANT.search(message)
        return "weights_end", {
            "elapsed_s": _float(_ELAPSED, message),
            "mem_usage_gb": _float(_MEM_USAGE, message),
            "avail_mem_gb": _float(_AVAIL_MEM, message),
            "model_type": model_type.group(1) if model_type else None,
            "quant": quant.group(1) if quant else None,
        }
    if message.startswith("Loading ") and "shards" in message:
        count = _TQDM_COUNT.search(message)
        if count:
            return "weights_progress", {"done": int(count.group(1)), "total": int(count.group(2))}
    return None


def _kv_cache(message: str) -> tuple[str, dict[str, Any]] | None:
    tokens = _TOKENS.search(message)
    if not tokens:
        return None
    sizes = {name: float(value) for name, value in _SIZE.findall(message)}
    dtype = _DTYPE.search(message)
    return "kv_cache", {
        "tokens": int(tokens.group(1)),
        "k_size_gb": sizes.get("K"),
        "v_size_gb": sizes.get("V"),
        "kv_size_gb": sizes.get("KV"),
        "dtype": dtype.group(1) if dtype else None,
        "draft": "draft" in message.split("KV", 1)[0].lower(),
    }


class LogParser:
    """Incremental parser: one raw output line in, the events it completes out."""

    def __init__(self, include_all: bool = False) -> None:
        self.include_all = include_all
        self.line = 0
        self.context = ParseContext()
        self._pending: _Pending | None = None
        self._diagnosed: set[str] = set()

    def feed(self, text: str) -> list[LogEvent]:
        self.line += 1
        text = text.rstrip("\n")
        if "\r" in text:
            return self._feed_updates(text)
        return self._feed_segment(text)

    def finish(self) -> list[LogEvent]:
        """End of stream: a traceback still being collected is complete now."""
        return self._flush_traceback()

    def _feed_updates(self, text: str) -> list[LogEvent]:
        # tqdm rewrites its bar with '\r'; every update is parsed, and only the
        # last update of each progress kind is reported (it is the current one).
        events: list[LogEvent] = []
        for segment in text.split("\r"):
            if segment.strip():
                events.extend(self._feed_segment(segment))
        last: dict[str, LogEvent] = {}
        for event in events:
            if event.kind in PROGRESS_KINDS:
                last[event.kind] = event
        kept = [e for e in events if e.kind not in PROGRESS_KINDS or last[e.kind] is e]
        if self.include_all and len(kept) > 1:
            kept = [e for e in kept if e.kind != "line"] or kept[:1]
        return kept

    def _feed_segment(self, text: str) -> list[LogEvent]:
        message, ranks = split_prefix(text)
        if self._pending is not None:
            absorbed, events = self._continue_traceback(text, message)
            if absorbed:
                return events
        else:
            events = []
        if TRACEBACK_START in message:
            events.extend(self._flush_traceback())
            self._pending = _Pending(self.line, ranks, [message])
            return events
        result = classify(message)
        if result is None:
            events.extend(self._unmatched(text, message))
            return events
        kind, fields = result
        if kind == "capture_bs":
            self.context.capture_bs = fields["bs"]
            return events + self._unmatched(text, message)
        self._observe(kind, fields)
        events.append(LogEvent(self.line, kind, {**fields, **ranks}))
        events.extend(self._diagnose_event(kind, fields))
        return events

    def _unmatched(self, text: str, message: str) -> list[LogEvent]:
        events: list[LogEvent] = []
        found = diag.match_line(message)
        if found is not None:
            events.extend(self._diagnosis_event(found, self.line))
        if self.include_all:
            events.insert(0, LogEvent(self.line, "line", {"text": text}))
        return events

    def _continue_traceback(self, raw: str, message: str) -> tuple[bool, list[LogEvent]]:
        """Add a line to the pending traceback; False when the line is not part of it."""
        pending = self._pending
        assert pending is not None
        is_record = raw[:1] == "[" and raw[1:3].isdigit()
        if pending.message is None:
            if is_record and TRACEBACK_START not in message:
                return False, []  # another process interleaved a log record
            return self._traceback_body(pending, message), []
        if message.startswith(CHAIN_MARKERS):
            # A chained exception follows; its own exception line becomes the message.
            pending.lines.append(message)
            pending.message = None
            return True, []
        if is_record or TRACEBACK_START in message or classify(message) is not None:
            return False, self._flush_traceback()
        if pending.continuation >= MAX_CONTINUATION_LINES:
            return False, self._flush_traceback()
        pending.continuation += 1
        pending.lines.append(message)
        return True, []

    def _traceback_body(self, pending: _Pending, message: str) -> bool:
        if len(pending.lines) < MAX_TRACEBACK_LINES:
            pending.lines.append(message)
        stripped = message.strip()
        if message[:1] in (" ", "\t") or not stripped or stripped.startswith("^"):
            return True
        if stripped.startswith(TRACEBACK_START):
            return True
        pending.message = stripped
        pending.continuation = 0
        return True

    def _flush_traceback(self) -> list[LogEvent]:
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        lines = list(pending.lines)
        while lines and not lines[-1].strip():
            lines.pop()
        message = pending.message or (lines[-1].strip() if lines else "")
        fields = {"message": message, "traceback": lines, **pending.ranks}
        events = [LogEvent(pending.line, "error", fields)]
        found = diag.match_error(message, lines, self.context)
        if found is not None:
            events.extend(self._diagnosis_event(found, pending.line, fatal=True))
        return events

    def _observe(self, kind: str, fields: dict[str, Any]) -> None:
        """Remember what later diagnoses need: phase, graph widths, batch sizes."""
        ctx = self.context
        if kind.startswith("selfcheck_"):
            ctx.phase = "selfcheck"
        elif kind == "weights_begin":
            ctx.phase = "load"
        elif kind in ("weights_end", "kv_cache"):
            ctx.phase = "loaded"
        elif kind == "capture_begin":
            ctx.phase = "capture"
            self._observe_capture(fields)
        elif kind == "capture_end":
            ctx.phase = "captured"
            if fields["bs"]:
                ctx.capture_bs = fields["bs"]
        elif kind == "capture_progress":
            ctx.phase = "capture"
            ctx.last_bs = fields["bs"]
        elif kind == "ready":
            ctx.phase = "serving"
        elif kind in ("decode_stats", "prefill_stats"):
            ctx.phase = "serving"
            running = fields.get("running_req") or 0
            ctx.max_running_req = max(ctx.max_running_req, running)
            if fields.get("accept_len") is not None:
                ctx.speculative = True

    def _observe_capture(self, fields: dict[str, Any]) -> None:
        ctx = self.context
        width = fields.get("num_tokens_per_req")
        if fields.get("mode") == "verify":
            ctx.speculative = True
            if fields.get("role") == "target" and width:
                ctx.verify_width = width
            elif fields.get("role") == "draft" and width:
                ctx.draft_width = width

    def _diagnose_event(self, kind: str, fields: dict[str, Any]) -> list[LogEvent]:
        if kind == "decode_stats":
            found = diag.match_decode(fields, self.context)
            return self._diagnosis_event(found, self.line) if found else []
        if kind == "selfcheck_report":
            self.context.selfcheck_reported = True
            found = diag.match_selfcheck(fields)
            return self._diagnosis_event(found, self.line, fatal=True) if found else []
        if kind == "selfcheck_exit" and fields["rc"] != 0 and not self.context.selfcheck_reported:
            found = diag.selfcheck_crashed(fields["rc"])
            return self._diagnosis_event(found, self.line, fatal=True)
        return []

    def _diagnosis_event(
        self, found: diag.Diagnosis, line: int, fatal: bool = False
    ) -> list[LogEvent]:
        # One diagnosis per cause: eight ranks repeating a warning say it once;
        # a fatal error still reports a cause first seen as a warning.
        key = f"{found.cause}:fatal" if fatal else found.cause
        if key in self._diagnosed:
            return []
        self._diagnosed.update((key, found.cause))
        fields = {**found.to_dict(), "fatal": fatal}
        return [LogEvent(line, "diagnosis", fields)]


def parse_lines(lines: Iterable[str], include_all: bool = False) -> Iterator[LogEvent]:
    """Parse a whole log (an iterable of lines, e.g. an open file)."""
    parser = LogParser(include_all=include_all)
    for text in lines:
        yield from parser.feed(text)
    yield from parser.finish()
