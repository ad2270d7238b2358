"""The recommendation: per concurrency the fastest candidate that may be recommended, those
levels merged into ranges, and the crossover where speculation stops paying.

A candidate may be recommended at a level when it was measured there with every request
answered, and it is the baseline or passed the losslessness check against it: a candidate
that failed the check, or was never checked (no baseline to check against), never is.
"Fastest" is output tokens per second.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from appliance.tune.candidates import BASELINE


def eligible(candidates: Iterable[dict[str, Any]]) -> set[str]:
    """The candidates that may be recommended: measured, and the baseline or lossless."""
    names = set()
    for c in candidates:
        if c.get("state") != "measured":
            continue
        if c["name"] == BASELINE or (c.get("lossless") or {}).get("passed") is True:
            names.add(c["name"])
    return names


def recommend(candidates: list[dict[str, Any]], rows: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """`candidates`: each {"name", "state", "lossless": {"passed": ...}}; `rows`: each
    {"candidate", "concurrency", "output_throughput", "completed", "errors"}.

    Returns {"per_level": [{concurrency, candidate, output_throughput, baseline_throughput,
    speedup}], "ranges": [{from, to, candidate}], "crossover": int | None, "summary": str}."""
    allowed = eligible(candidates)
    levels = sorted({int(r["concurrency"]) for r in rows})
    order = [c["name"] for c in candidates]
    per_level = []
    for level in levels:
        here = [r for r in rows if int(r["concurrency"]) == level
                and r["candidate"] in allowed and r.get("completed", 0) > 0
                and not r.get("errors")]
        base = next((r for r in rows if int(r["concurrency"]) == level
                     and r["candidate"] == BASELINE), None)
        base_tps = float(base["output_throughput"]) if base else None
        if not here:
            per_level.append({"concurrency": level, "candidate": None,
                              "output_throughput": None, "baseline_throughput": base_tps,
                              "speedup": None})
            continue
        # The fastest; on a tie the earlier candidate (the baseline first: no speculation
        # where it buys nothing).
        best = max(here, key=lambda r: (float(r["output_throughput"]),
                                        -order.index(r["candidate"])))
        tps = float(best["output_throughput"])
        per_level.append({"concurrency": level, "candidate": best["candidate"],
                          "output_throughput": tps, "baseline_throughput": base_tps,
                          "speedup": tps / base_tps if base_tps else None})
    ranges: list[dict[str, Any]] = []
    for entry in per_level:
        if ranges and ranges[-1]["candidate"] == entry["candidate"]:
            ranges[-1]["to"] = entry["concurrency"]
        else:
            ranges.append({"from": entry["concurrency"], "to": entry["concurrency"],
                           "candidate": entry["candidate"]})
    crossover = _crossover(per_level)
    return {"per_level": per_level, "ranges": ranges, "crossover": crossover,
            "summary": _summary(per_level, ranges, crossover)}


def _pays(entry: dict[str, Any]) -> bool:
    return entry["candidate"] not in (None, BASELINE)


def _crossover(per_level: list[dict[str, Any]]) -> int | None:
    """The lowest level from which on no speculative candidate beats the baseline (at every
    level measured above it too); None when speculation pays at the highest level, or when
    no level had a recommendation."""
    judged = [e for e in per_level if e["candidate"] is not None]
    if not judged or _pays(judged[-1]):
        return None
    crossover = judged[-1]["concurrency"]
    for entry in reversed(judged):
        if _pays(entry):
            break
        crossover = entry["concurrency"]
    return int(crossover)


def _summary(per_level: list[dict[str, Any]], ranges: list[dict[str, Any]],
             crossover: int | None) -> str:
    judged = [e for e in per_level if e["candidate"] is not None]
    if not judged:
        return "no candidate may be recommended: none was measured and lossless"
    parts = []
    for r in ranges:
        if r["candidate"] is None:
            continue
        span = (f"concurrency {r['from']}" if r["from"] == r["to"]
                else f"concurrency {r['from']}-{r['to']}")
        parts.append(f"{r['candidate']} at {span}")
    text = "recommended: " + "; ".join(parts)
    if crossover is None:
        top = judged[-1]["concurrency"]
        return f"{text}. Speculation pays at every level measured (up to {top})."
    if crossover == judged[0]["concurrency"]:
        return f"{text}. Speculation does not pay at any level measured."
    return f"{text}. Speculation stops paying at concurrency {crossover}."
