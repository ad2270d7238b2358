"""The incremental log parser: raw engine output lines in, events out.

Each line is classified by appliance.logs.lines (what each kind carries: appliance.events);
tracebacks are collected across lines;
what the log has said so far (appliance.logs.context) feeds the diagnoses
(appliance.logs.matchers), at most one per cause.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.events import KV_CACHE, SERVER_ARGS, WEIGHTS_BEGIN, WEIGHTS_END
from appliance.logs import matchers as diag
from appliance.logs.causes import Diagnosis
from appliance.logs.context import ParseContext
from appliance.logs.engine_warnings import match_engine_warning
from appliance.logs.facts import DEVICE_CONTEXT_PREFIX, device_context_facts
from appliance.logs.lines import (
    CHAIN_MARKERS,
    MAX_CONTINUATION_LINES,
    MAX_TRACEBACK_LINES,
    PROGRESS_KINDS,
    TRACEBACK_START,
    classify,
    split_prefix,
)

# Lines that belong to one model of a deployment: the target's or the drafter's.
_MODEL_KINDS = frozenset({WEIGHTS_BEGIN, WEIGHTS_END, KV_CACHE})


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



class LogParser:
    """Incremental parser: one raw output line in, the events it completes out."""

    def __init__(self, include_all: bool = False,
                 needed_widths: Mapping[str, int] | None = None,
                 facts: Mapping[str, Any] | None = None) -> None:
        """facts: what the deployment's spec says (appliance.logs.facts.spec_facts)."""
        self.include_all = include_all
        self.line = 0
        self.context = ParseContext(needed_widths=dict(needed_widths) if needed_widths else None,
                                    facts=dict(facts or {}))
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
        if kind == SERVER_ARGS:  # facts for the causes, not an event of its own
            self.context.facts.update(fields)  # what the engine resolved wins over the spec
            return events + self._unmatched(text, message)
        if kind in _MODEL_KINDS:
            fields = self._with_model(kind, fields, ranks)
        self._observe(kind, fields)
        if kind == "capture_begin":
            fields = self._with_needed_width(fields)
        events.append(LogEvent(self.line, kind, {**fields, **ranks}))
        events.extend(self._diagnose_event(kind, fields))
        return events

    def _unmatched(self, text: str, message: str) -> list[LogEvent]:
        events: list[LogEvent] = []
        if message[:16] == DEVICE_CONTEXT_PREFIX:
            self.context.facts.update(device_context_facts(message))
        found = diag.match_line(message) or match_engine_warning(message)
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
        self.context.error_ranks = dict(pending.ranks)
        found = diag.match_error(message, lines, self.context)
        if found is not None:
            events.extend(self._diagnosis_event(found, pending.line, fatal=True))
        return events

    def _observe(self, kind: str, fields: Mapping[str, Any]) -> None:
        """Remember what later diagnoses need: phase, graph widths, batch sizes."""
        ctx = self.context
        if kind in ("decode_stats", "prefill_stats"):  # first: a serving engine's every line
            ctx.phase = "serving"
            running = fields.get("running_req") or 0
            ctx.max_running_req = max(ctx.max_running_req, running)
            if fields.get("accept_len") is not None:
                ctx.speculative = True
        elif kind.startswith("selfcheck_"):
            ctx.phase = "selfcheck"
        elif kind == "weights_begin":
            ctx.phase = "load"
        elif kind in ("weights_end", "kv_cache"):
            ctx.phase = "loaded"
        elif kind == "capture_begin":
            ctx.phase = "capture"
            self._observe_capture(fields)
            if fields.get("bs"):
                ctx.capture_bs = fields["bs"]
        elif kind == "capture_end":
            ctx.phase = "captured"
            if fields["bs"]:
                ctx.capture_bs = fields["bs"]
        elif kind == "capture_progress":
            ctx.phase = "capture"
            ctx.last_bs = fields["bs"]
        elif kind == "ready":
            ctx.phase = "serving"

    def _observe_capture(self, fields: Mapping[str, Any]) -> None:
        ctx = self.context
        width = fields.get("num_tokens_per_req")
        if fields.get("mode") == "verify":
            ctx.speculative = True
            if fields.get("role") == "target" and width:
                ctx.verify_width = width
            elif fields.get("role") == "draft" and width:
                ctx.draft_width = width

    def _with_model(self, kind: str, fields: Mapping[str, Any],
                    ranks: dict[str, int]) -> Mapping[str, Any]:
        """Whose load or KV pool a line is: the first on a rank is the target's, a later one
        the drafter's (the real 433c58ed7 log: target load, draft load, target KV with
        `KV size`, draft KV with `K size`/`V size`; tests/fixtures/real-engine)."""
        ctx, rank = self.context, tuple(sorted(ranks.items()))
        counts = {"weights_begin": ctx.loads_begun, "weights_end": ctx.loads_ended,
                  "kv_cache": ctx.kv_pools}[kind]
        seen = counts.get(rank, 0)
        counts[rank] = seen + 1
        model = "draft" if seen or fields.get("draft") else "target"
        if kind == "kv_cache":
            return {**fields, "model": model, "draft": model == "draft"}
        return {**fields, "model": model}

    def _with_needed_width(self, fields: Mapping[str, Any]) -> Mapping[str, Any]:
        """A verify capture's line with the width the spec needs for that role beside it."""
        needed = self.context.needed_widths or {}
        if fields.get("mode") != "verify" or fields.get("role") not in needed:
            return fields
        return {**fields, "needed_tokens_per_req": needed[fields["role"]]}

    def _diagnose_event(self, kind: str, fields: Mapping[str, Any]) -> list[LogEvent]:
        if kind == "capture_begin":
            found = diag.match_capture(self._with_needed_width(fields))
            return self._diagnosis_event(found, self.line) if found else []
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
        self, found: Diagnosis, line: int, fatal: bool = False
    ) -> list[LogEvent]:
        # One diagnosis per cause: eight ranks repeating a warning say it once;
        # a fatal error still reports a cause first seen as a warning.
        key = f"{found.cause}:fatal" if fatal else found.cause
        if key in self._diagnosed:
            return []
        self._diagnosed.update((key, found.cause))
        fields = {**found.to_dict(), "fatal": fatal}
        return [LogEvent(line, "diagnosis", fields)]


def parse_lines(lines: Iterable[str], include_all: bool = False,
                facts: Mapping[str, Any] | None = None) -> Iterator[LogEvent]:
    """Parse a whole log (an iterable of lines, e.g. an open file); facts: the spec's."""
    parser = LogParser(include_all=include_all, facts=facts)
    for text in lines:
        yield from parser.feed(text)
    yield from parser.finish()
