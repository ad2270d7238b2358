"""The event kinds, and what each carries: the one place that says it.

Two layers, both JSON objects:

- A **parser event** is what appliance.logs.lines and appliance.logs.parser make of an
  engine line: `{"line": N, "kind": <parser kind>, **fields, **ranks}` (LogEvent.to_dict).
  Its fields are the TypedDicts below, one per kind (WeightsBegin, CaptureProgress, ...);
  the ranks are the prefix's (`TP3` -> `"tp": 3`, Ranks).
- A **stored event** is one Event row of a deployment (web.deployments.models.Event): a
  stored kind (STORED_KINDS: "log", "progress", "metric", "diagnosis", ...) and a payload.
  The engine agent's follower ships parser events as the payloads of "progress" (loads,
  captures, the KV pool, ready), "metric" (decode and prefill stats), "selfcheck" and
  "diagnosis" rows; a "log" row carries the raw line (LogLine), an "alert" row an alert
  (AlertPayload).

The parser writes through these types (mypy holds every payload it builds to them) and web
reads through `engine_event`, which narrows a stored payload to its kind's TypedDict.

VERSION is the payloads' shape. Version 1 is the shape stored from the start and carries no
version key, so every row ever stored reads as it is. A later shape adds `"v": 2` to its
payloads, and `engine_event` keeps reading version 1 beside it.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated
# annotations (its __required_keys__, which the tests hold the parser to).
from collections.abc import Mapping
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

VERSION: Final = 1

# ---------------------------------------------------------------- stored kinds
LOG: Final = "log"
PROGRESS: Final = "progress"
METRIC: Final = "metric"
DIAGNOSIS: Final = "diagnosis"
SELFCHECK: Final = "selfcheck"
STATUS: Final = "status"
ALERT: Final = "alert"
# The follower and the monitor ship the kinds above; the web writes these.
PHASE: Final = "phase"  # a status change: {"status", "message", ...} (the lifecycle's)
BUILD: Final = "build"  # an image build's step or output line
PREFLIGHT: Final = "preflight"  # the findings a deploy was checked with
END: Final = "end"  # the run ended: {"status", "message"}
AGENT_KINDS: Final = frozenset({LOG, PROGRESS, METRIC, DIAGNOSIS, SELFCHECK, STATUS, ALERT})
# Every stored kind (web.deployments.models.EventKind holds the same values).
STORED_KINDS: Final = AGENT_KINDS | {PHASE, BUILD, PREFLIGHT, END}

# ---------------------------------------------------------------- parser kinds
WEIGHTS_BEGIN: Final = "weights_begin"
WEIGHTS_PROGRESS: Final = "weights_progress"
WEIGHTS_END: Final = "weights_end"
KV_CACHE: Final = "kv_cache"
CAPTURE_BEGIN: Final = "capture_begin"
CAPTURE_PROGRESS: Final = "capture_progress"
CAPTURE_END: Final = "capture_end"
CAPTURE_BS: Final = "capture_bs"  # SGLang 0.4's batch-size list: the parser's own, not shipped
# The engine's `server_args=ServerArgs(...)` line: facts for the causes (appliance.logs.facts),
# the parser's own, not shipped.
SERVER_ARGS: Final = "server_args"
READY: Final = "ready"
DECODE_STATS: Final = "decode_stats"
PREFILL_STATS: Final = "prefill_stats"
SELFCHECK_START: Final = "selfcheck_start"
SELFCHECK_BEGIN: Final = "selfcheck_begin"
SELFCHECK_GPUS: Final = "selfcheck_gpus"
SELFCHECK_CHECK: Final = "selfcheck_check"
SELFCHECK_REPORT: Final = "selfcheck_report"
SELFCHECK_EXIT: Final = "selfcheck_exit"
ERROR: Final = "error"
PARSED_DIAGNOSIS: Final = "diagnosis"
LINE: Final = "line"  # a line that matched nothing (parse-log --all only)

# Shipped as a "progress" row: the loads, the captures, the KV pool, ready.
PROGRESS_KINDS: Final = frozenset({WEIGHTS_BEGIN, WEIGHTS_PROGRESS, WEIGHTS_END, KV_CACHE,
                                   CAPTURE_BEGIN, CAPTURE_PROGRESS, CAPTURE_END, READY})
# A tqdm bar's kinds: of a redrawn bar only the last update counts.
BAR_KINDS: Final = frozenset({WEIGHTS_PROGRESS, CAPTURE_PROGRESS})
STATS_KINDS: Final = frozenset({DECODE_STATS, PREFILL_STATS})  # shipped as "metric" rows


class Ranks(TypedDict, total=False):
    """The ranks of a line's prefix (`[... DP1 TP3 EP3]`, torch's `[rank3]:`), lower-cased."""

    dp: int
    pp: int
    tp: int
    ep: int
    attn_cp: int
    moe_dp: int
    rank: int


# ---- the fields of each parser kind (what appliance.logs.lines builds)


class WeightsBegin(TypedDict):
    avail_mem_gb: float | None
    model: NotRequired[str]  # "target" or "draft", set by the parser per rank


class WeightsProgress(TypedDict):
    done: int
    total: int


class WeightsEnd(TypedDict):
    elapsed_s: float | None
    mem_usage_gb: float | None
    avail_mem_gb: float | None
    model_type: str | None
    quant: str | None
    model: NotRequired[str]


class KvCache(TypedDict):
    tokens: int
    k_size_gb: float | None
    v_size_gb: float | None
    kv_size_gb: float | None
    dtype: str | None
    draft: bool
    model: NotRequired[str]


class CaptureBegin(TypedDict):
    role: str | None  # "target", "draft" or None (a plain model)
    mode: str | None  # "verify", "decode", ... as SGLang names the graph
    num_tokens_per_req: int | None
    backend: str | None
    avail_mem_gb: float | None
    bs: NotRequired[list[int]]  # newer SGLang lists the batch sizes on the begin line
    needed_tokens_per_req: NotRequired[int]  # the width the spec needs, set by the parser


class CaptureProgress(TypedDict):
    bs: int
    done: int | None
    total: int | None
    avail_mem_gb: float


class CaptureEnd(TypedDict):
    role: str | None
    mode: str | None
    elapsed_s: float | None
    bs: list[int] | None
    mem_usage_gb: float | None
    avail_mem_gb: float | None


class CaptureBs(TypedDict):
    bs: list[int]


class Ready(TypedDict):
    pass


class DecodeStats(TypedDict):
    running_req: int | None
    tokens: int | None
    token_usage: float | None
    accept_len: float | None
    accept_rate: float | None
    cuda_graph: bool | None
    gen_throughput: float | None
    queue_req: int | None


class PrefillStats(TypedDict):
    new_seq: int | None
    new_token: int | None
    cached_token: int | None
    token_usage: float | None
    running_req: int | None
    queue_req: int | None
    pending_token: int | None
    cuda_graph: bool | None
    input_throughput: float | None


class SelfcheckStart(TypedDict):
    pass


class SelfcheckBegin(TypedDict):
    """appliance.selfcheck's `begin` stream line."""

    gpus: list[int]
    roles: list[dict[str, Any]]  # GraphRole: role, width, mask
    max_bs: NotRequired[int]


class SelfcheckGpus(TypedDict):
    """appliance.selfcheck's `gpus` stream line: what NVML found."""

    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[dict[str, Any]]


class SelfcheckCheck(TypedDict):
    id: str
    ok: bool
    message: str
    fix: str


class SelfcheckReport(TypedDict, total=False):
    """appliance.selfcheck's Report.to_dict (the keys a crash's short report lacks optional)."""

    ok: bool
    elapsed_s: float
    driver_version: str | None
    cuda_driver_version: str | None
    torch_version: str | None
    gpus: list[dict[str, Any]]
    topology: dict[str, Any]
    allreduce: dict[str, Any]
    graphs: list[dict[str, Any]]
    checks: list[dict[str, Any]]


class SelfcheckExit(TypedDict):
    rc: int


class Error(TypedDict):
    message: str
    traceback: list[str]


class ParsedDiagnosis(TypedDict):
    """appliance.logs.cause.Diagnosis.to_dict, and whether a traceback carried it."""

    cause: str  # an id of the failure catalogue (appliance.logs.catalogue)
    summary: str
    fix: str
    evidence: dict[str, Any]
    patch: NotRequired[dict[str, Any]]
    # A finding while the engine runs (an engine warning, a note): "info" or "warning".
    severity: NotRequired[str]
    fatal: bool


# ---- a parser event as stored: the fields with the line, the kind and the ranks


class _Stamped(Ranks):
    line: int
    partial: NotRequired[bool]  # a tqdm bar drawn before its newline (live progress only)


class WeightsBeginEvent(WeightsBegin, _Stamped):
    kind: Literal["weights_begin"]


class WeightsProgressEvent(WeightsProgress, _Stamped):
    kind: Literal["weights_progress"]


class WeightsEndEvent(WeightsEnd, _Stamped):
    kind: Literal["weights_end"]


class KvCacheEvent(KvCache, _Stamped):
    kind: Literal["kv_cache"]


class CaptureBeginEvent(CaptureBegin, _Stamped):
    kind: Literal["capture_begin"]


class CaptureProgressEvent(CaptureProgress, _Stamped):
    kind: Literal["capture_progress"]


class CaptureEndEvent(CaptureEnd, _Stamped):
    kind: Literal["capture_end"]


class ReadyEvent(Ready, _Stamped):
    kind: Literal["ready"]


class DecodeStatsEvent(DecodeStats, _Stamped):
    kind: Literal["decode_stats"]


class PrefillStatsEvent(PrefillStats, _Stamped):
    kind: Literal["prefill_stats"]


class SelfcheckStartEvent(SelfcheckStart, _Stamped):
    kind: Literal["selfcheck_start"]


class SelfcheckBeginEvent(SelfcheckBegin, _Stamped):
    kind: Literal["selfcheck_begin"]


class SelfcheckGpusEvent(SelfcheckGpus, _Stamped):
    kind: Literal["selfcheck_gpus"]


class SelfcheckCheckEvent(SelfcheckCheck, _Stamped):
    kind: Literal["selfcheck_check"]


class SelfcheckReportEvent(SelfcheckReport, _Stamped):
    kind: Literal["selfcheck_report"]


class SelfcheckExitEvent(SelfcheckExit, _Stamped):
    kind: Literal["selfcheck_exit"]


class DiagnosisEvent(ParsedDiagnosis, _Stamped):
    kind: Literal["diagnosis"]


EngineEvent = (
    WeightsBeginEvent | WeightsProgressEvent | WeightsEndEvent | KvCacheEvent
    | CaptureBeginEvent | CaptureProgressEvent | CaptureEndEvent | ReadyEvent
    | DecodeStatsEvent | PrefillStatsEvent | SelfcheckStartEvent | SelfcheckBeginEvent
    | SelfcheckGpusEvent | SelfcheckCheckEvent | SelfcheckReportEvent | SelfcheckExitEvent
    | DiagnosisEvent
)
ENGINE_KINDS: Final = frozenset({
    WEIGHTS_BEGIN, WEIGHTS_PROGRESS, WEIGHTS_END, KV_CACHE, CAPTURE_BEGIN, CAPTURE_PROGRESS,
    CAPTURE_END, READY, DECODE_STATS, PREFILL_STATS, SELFCHECK_START, SELFCHECK_BEGIN,
    SELFCHECK_GPUS, SELFCHECK_CHECK, SELFCHECK_REPORT, SELFCHECK_EXIT, PARSED_DIAGNOSIS})


# ---- the other stored payloads the appliance writes


class LogLine(TypedDict):
    stream: str  # "stdout" or "stderr"
    text: str


class StatusNote(TypedDict):
    message: str


class Alert(TypedDict):
    """appliance.runtime.alerts.Alert.to_dict: what the alert rules raise or resolve."""

    id: str
    state: str  # "firing" or "resolved"
    severity: str  # "info", "warning" or "critical"
    summary: str
    fix: str
    evidence: dict[str, Any]


class AlertPayload(Alert):
    """An "alert" row: the alert, and when it was raised (and cleared), as the agent stores
    it (web/deployments/services/metrics.py); rows before raised_at said "since"."""

    raised_at: str | None
    cleared_at: NotRequired[str]


class UnknownEvent(ValueError):
    """A stored payload of a kind or a version this code does not read."""


def engine_event(payload: Mapping[str, Any]) -> EngineEvent:
    """A stored parser event, typed by its kind ("progress", "metric", "selfcheck" and
    "diagnosis" rows); UnknownEvent for a kind or version this code does not know."""
    version = payload.get("v", 1)
    if version != VERSION:
        raise UnknownEvent(f"event payload version {version!r}: this code reads {VERSION}")
    kind = payload.get("kind")
    if kind not in ENGINE_KINDS:
        raise UnknownEvent(f"event payload kind {kind!r} is not a parser kind "
                           f"(appliance/events.py lists them)")
    return cast(EngineEvent, payload)
