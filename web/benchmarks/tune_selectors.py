"""Reads: Tunes, and a Tune's CSV export (one row per candidate and level)."""

from __future__ import annotations

import csv
import io

from django.db.models import QuerySet

from .tune_models import TuneRun

COLUMNS = ("candidate", "algorithm", "state", "lossless", "concurrency", "completed", "errors",
           "output_throughput", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
           "accept_len", "recommended", "simulator")


def tune_list() -> QuerySet[TuneRun]:
    return TuneRun.objects.order_by("-created_at")


def lossless_word(candidate: dict[str, object]) -> str:
    found = candidate.get("lossless")
    if not isinstance(found, dict):
        return "not checked"
    if found.get("baseline"):
        return "baseline"
    passed = found.get("passed")
    return "passed" if passed is True else "failed" if passed is False else "not checked"


def tune_csv(*, run: TuneRun) -> str:
    results = run.results or {}
    candidates = {c["name"]: c for c in results.get("candidates", [])}
    chosen = {(e["candidate"], e["concurrency"]) for e in (results.get(
        "recommendation") or {}).get("per_level", []) if e.get("candidate")}
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in results.get("rows", []):
        cand = candidates.get(row["candidate"], {})
        writer.writerow([row["candidate"], cand.get("algorithm"), cand.get("state"),
                         lossless_word(cand), row["concurrency"], row.get("completed"),
                         row.get("errors"), row.get("output_throughput"),
                         row["ttft_ms"]["p50"], row["ttft_ms"]["p99"],
                         row["tpot_ms"]["p50"], row["tpot_ms"]["p99"], row.get("accept_len"),
                         (row["candidate"], row["concurrency"]) in chosen,
                         bool(results.get("simulator"))])
    for name, cand in candidates.items():  # skipped and failed candidates: a row each
        if cand.get("state") != "measured" and not any(
                r["candidate"] == name for r in results.get("rows", [])):
            writer.writerow([name, cand.get("algorithm"), cand.get("state"),
                             lossless_word(cand), "", "", "", "", "", "", "", "", "", False,
                             bool(results.get("simulator"))])
    return out.getvalue()
