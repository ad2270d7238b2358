"""Reads for losslessness checks: the runs, the deployments each side may be, the CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from django.db.models import QuerySet

from web.deployments.models import Deployment

from .selectors import ready_deployments
from .verification_models import VerificationRun

CSV_COLUMNS = ("index", "prompt", "verdict", "position", "gap", "candidate_in_top2",
               "candidate_gap", "candidate_ids", "candidate_text", "baseline_ids",
               "baseline_text")


def verification_list() -> QuerySet[VerificationRun]:
    return VerificationRun.objects.select_related("candidate", "baseline").order_by(
        "-created_at")


def speculative_ready() -> QuerySet[Deployment]:
    return ready_deployments().exclude(algorithm="NONE")


def baseline_ready() -> QuerySet[Deployment]:
    return ready_deployments().filter(algorithm="NONE")


def verification_prompt_rows(*, run: VerificationRun) -> list[dict[str, Any]]:
    """Per prompt: the finished results, or while it runs those judged so far."""
    rows = (run.results or {}).get("prompts") or (run.progress or {}).get("prompts") or []
    return list(rows)


def _side(side: dict[str, Any] | None) -> tuple[str, str]:
    if not side:
        return "", ""
    return json.dumps(side.get("ids") or []), side.get("text") or ""


def verification_csv(*, run: VerificationRun) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for p in verification_prompt_rows(run=run):
        writer.writerow([p["index"], p["prompt"], p["verdict"], p.get("position"), p.get("gap"),
                         p.get("candidate_in_top2"), p.get("candidate_gap"),
                         *_side(p.get("a")), *_side(p.get("b"))])
    return out.getvalue()
