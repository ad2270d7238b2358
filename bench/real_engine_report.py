"""Figures of the real engine's recordings (tests/fixtures/real-engine), for the issue notes.

    .venv/bin/python bench/real_engine_report.py

Speed: `appliance bench` at concurrency 1, 8, 32 against the real engine in one H200 call
(ddtree_triton, dflash_triton, base_triton ran back to back), as ratios to no speculation;
the cost of one step (TPOT x accept length = the time between verify steps). Shortcut: the
engine ran on the GPU host without Docker, the bench as a subprocess beside it (loopback).
Time to ready: from the engine log's own timestamps, split as the panel's phases are.
Losslessness: the probe prompts' first divergence from no speculation and the gap there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.bench.lossless import first_divergence  # noqa: E402
from tests import real_engine as rec  # noqa: E402

# fa3 ran in later calls; its ratios are to triton's none.
MODES = {"DDTREE": "ddtree_triton", "DFLASH": "dflash_triton", "none": "base_triton",
         "DDTREE fa3": "ddtree_fa3", "DFLASH fa3": "dflash_fa3"}


def _levels(run: str) -> dict[int, dict[str, Any]]:
    return {level["concurrency"]: level["json"]["levels"][0]
            for level in rec.json_file(run, "bench.json")}


def speed() -> None:
    base = _levels(MODES["none"])
    print("mode       conc  out tok/s  x base   TPOT ms  accept  step ms  step x base")
    for mode, run in MODES.items():
        for conc, lv in _levels(run).items():
            accept = lv.get("accept_len") or 1.0
            step = lv["tpot_ms"]["mean"] * accept
            base_step = base[conc]["tpot_ms"]["mean"]
            ratio = lv["output_throughput"] / base[conc]["output_throughput"]
            print(f"{mode:10} {conc:>4} {lv['output_throughput']:>10.1f} {ratio:>7.2f}"
                  f" {lv['tpot_ms']['mean']:>9.2f} {accept:>7.3f} {step:>8.2f}"
                  f" {step / base_step:>12.2f}")


def _first(run: str, text: str) -> int | None:
    return next((line.ts_ns for line in rec.lines(run) if text in line.text), None)


def _all(run: str, text: str) -> list[int]:
    return [line.ts_ns for line in rec.lines(run) if text in line.text]


def ready_split(run: str) -> None:
    ready_s = rec.run_info(run)["ready_s"]
    ready = _first(run, "fired up and ready to roll")
    assert ready is not None
    start = ready - int(ready_s * 1e9)
    marks = [("imports and process start", start, _first(run, "Load weight begin")),
             ("weights", _first(run, "Load weight begin"), _all(run, "Load weight end")[-1]),
             ("KV cache", _all(run, "Load weight end")[-1], _all(run, "KV Cache is allocated")[-1])]
    for role in ("target", "draft"):
        begin = [ts for ts in _all(run, f"Capture {role} ") if ts]
        if begin:
            marks.append((f"capture {role}", _first(run, f"Capture {role} "), begin[-1]))
    last_capture = max(_all(run, "CUDA graph end"))
    marks.append(("warm-up to ready", last_capture, ready))
    print(f"{run}: ready in {ready_s} s: " + ", ".join(
        f"{name} {(b - a) / 1e9:.1f} s" for name, a, b in marks if a and b))


def lossless() -> None:
    base = [a["response"] for a in rec.json_file("base_triton", "probe.json")]
    for run in ("ddtree_probe", "dflash_probe", "ddtree_fa3"):  # fa3 against triton's base
        cand = [a["response"] for a in rec.json_file(run, "probe.json")]
        found = [first_divergence(b["output_ids"], b["meta_info"]["output_top_logprobs"],
                                  c["output_ids"]) for b, c in zip(base, cand, strict=True)]
        gaps = [f"{d.position}@{d.gap:.4f}" for d in found if d.gap is not None]
        verdicts = [d.verdict for d in found]
        counts = {v: verdicts.count(v) for v in ("identical", "near-tie", "failure")}
        print(f"{run} vs base: {counts['identical']} identical, {counts['near-tie']} near-ties, "
              f"{counts['failure']} failures; first divergence@gap: {', '.join(gaps)}")


if __name__ == "__main__":
    speed()
    print()
    for run in ("ddtree_triton", "ddtree_probe", "ddtree_fa3", "dflash_triton", "dflash_fa3",
                "base_triton", "bigload_triton"):
        ready_split(run)
    print()
    lossless()
