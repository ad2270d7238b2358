"""What the list page shows of a deployment row (rows.DeploymentRow), as text.

The page's first paint (the template) and its refresh (list.js, from the JSON view) both
show these strings, so the two cannot disagree on a format.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .rows import DeploymentRow

DASH = "–"


def _utc(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def uptime_text(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def throughput_text(tok_s: float | None) -> str:
    return DASH if tok_s is None else f"{tok_s:.1f} tok/s"


def row_texts(row: DeploymentRow, *, gateway: str = "") -> dict[str, Any]:
    """The row as text. gateway: the OpenAI base URL clients call (the panel's /v1), shown as
    the Endpoint of a deployment that serves, with the `model` it is called by; the engine's
    own address is on the engines' network, where no client reaches it."""
    serving = bool(row.endpoint) and bool(gateway)
    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "algorithm": row.algorithm,
        "recipe": row.recipe,
        "gpus": ",".join(str(g) for g in row.gpus),
        "created": _utc(row.created_at),
        "created_iso": row.created_at.astimezone(UTC).isoformat(),
        "uptime": uptime_text(row.uptime_s),
        "uptime_s": row.uptime_s,
        "ready_since": _utc(row.ready_at) if row.ready_at else "",
        "throughput": throughput_text(row.throughput),
        "throughput_tok_s": row.throughput,
        "throughput_at": _utc(row.throughput_at) if row.throughput_at else "",
        "endpoint": gateway if serving else "",  # empty: none yet (the page shows a dash)
        "model": row.model if serving else "",
        "silent": row.silent,  # its agent is silent: why the status says unknown
        "replicas": row.replicas,  # "3 replicas (2 ready)"; empty for one engine
    }
