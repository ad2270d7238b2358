"""Matchers the parser calls as lines arrive: one exception, one line, decode stats, a
self-check report. Each returns the Diagnosis of the catalogue's cause it recognises."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from appliance.logs.causes import BY_PRIORITY, CAUSES, LINE_TRIGGERS, SELFCHECK_CAUSE, Diagnosis
from appliance.logs.context import ParseContext
from appliance.logs.eager_causes import eager_decode


def match_error(
    message: str, traceback: Sequence[str], ctx: ParseContext | None = None
) -> Diagnosis | None:
    """The most specific cause of one exception (its message and traceback lines)."""
    text = "\n".join(traceback) if traceback else message
    if message not in text:
        text = f"{text}\n{message}"
    for cause in BY_PRIORITY:
        found = cause.match(text, ctx)
        if found is not None:
            return found
    return None


def match_line(message: str) -> Diagnosis | None:
    """A cause named by a single log line, without a traceback."""
    for needle, cause_id in LINE_TRIGGERS:
        if needle in message:
            return CAUSES[cause_id].match(message, None)
    return None


def match_capture(fields: Mapping[str, Any]) -> Diagnosis | None:
    """graph-width-mismatch: a role's verify graph captured at another width than the spec
    needs (DDTree's target at the block size instead of budget+1), seen at capture time."""
    needed, captured = fields.get("needed_tokens_per_req"), fields.get("num_tokens_per_req")
    if needed is None or captured is None or needed == captured:
        return None
    return CAUSES["graph-width-mismatch"].diagnosis(
        role=fields.get("role"), captured_width=captured, needed_width=needed)


def match_decode(stats: Mapping[str, Any], ctx: ParseContext | None = None) -> Diagnosis | None:
    """Speculative decode stats reporting `cuda graph: False`, by the cause the evidence
    shows (appliance.logs.eager_causes): graphs off by the spec, a batch above the captured
    sizes, a verify width the graph was not captured at, or none of these."""
    if stats.get("cuda_graph") is not False or stats.get("accept_len") is None:
        return None
    return eager_decode(stats, ctx, CAUSES["silent-eager-verify"],
                        CAUSES["cuda-graphs-disabled"], CAUSES["eager-above-max-bs"])


def match_selfcheck(report: Mapping[str, Any]) -> Diagnosis | None:
    """gpu-selfcheck-failed from a self-check report (appliance.selfcheck --stream)."""
    if report.get("ok"):
        return None
    failed = [c for c in report.get("checks") or [] if not c.get("ok")]
    if not failed:
        return Diagnosis(SELFCHECK_CAUSE.id, "The GPU self-check reported a failure but no failed "
                         "check.", SELFCHECK_CAUSE.fix, {"elapsed_s": report.get("elapsed_s")})
    first = failed[0]
    more = f" (and {len(failed) - 1} more failed check(s))" if len(failed) > 1 else ""
    summary = (f"The GPU self-check failed before the model load: {first.get('id')}: "
               f"{first.get('message')}{more}")
    fix = str(first.get("fix") or SELFCHECK_CAUSE.fix)
    evidence = {
        "failed": [{k: c.get(k) for k in ("id", "message", "fix")} for c in failed],
        "elapsed_s": report.get("elapsed_s"),
        "driver_version": report.get("driver_version"),
    }
    return Diagnosis(SELFCHECK_CAUSE.id, summary, fix, evidence)


def selfcheck_crashed(rc: int) -> Diagnosis:
    """The self-check ended with an error status and never printed its report."""
    return Diagnosis(
        SELFCHECK_CAUSE.id,
        f"The GPU self-check exited with code {rc} before printing its report.",
        "Read the self-check's output above; a missing /opt/appliance/selfcheck.pyz means the "
        "image was not built by the appliance (a fixed APPLIANCE_ENGINE_IMAGE made elsewhere): "
        "use one made by `appliance build RECIPE`, or untick the GPU self-check; a crash means "
        "a broken driver or CUDA install.",
        {"rc": rc},
    )
