"""Time LogParser over a realistic mixed SGLang log on one core.

    python bench/parse_log_bench.py [--lines 250000] [--log FILE] [--repeat 3]

Without --log it builds the mix a long-running DFlash deployment produces:
mostly Decode/Prefill batch lines and HTTP access lines, plus startup phases,
tqdm `\\r` bars, warnings and a few tracebacks, by repeating the fixture logs
under tests/fixtures/logs and a serving section. Prints lines/s and the
ratio to the 100,000 lines/s target.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance.logs.parser import LogParser  # noqa: E402

TARGET_LINES_PER_S = 100_000
FIXTURES = ROOT / "tests" / "fixtures" / "logs"


def serving_block(step: int) -> list[str]:
    """Ten lines of steady serving, the bulk of a real engine log."""
    ts = f"2026-05-03 12:{step // 60 % 60:02d}:{step % 60:02d}"
    return [
        f"[{ts} TP0] Decode batch, #running-req: {step % 48 + 1}, #token: {1500 + step}, "
        f"token usage: 0.01, accept len: 4.{step % 10}7, accept rate: 0.70, cuda graph: True, "
        f"gen throughput (token/s): {300 + step % 97}.12, #queue-req: {step % 3}",
        f"[{ts} TP0] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: {step % 512}, "
        f"token usage: 0.01, #running-req: {step % 48}, #queue-req: 0, #pending-token: 0, "
        f"cuda graph: False, input throughput (token/s): 4120.55",
        f'[{ts}] INFO:     10.0.0.{step % 250}:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        f'[{ts}] INFO:     127.0.0.1:40112 - "GET /metrics HTTP/1.1" 200 OK',
        f'[{ts}] INFO:     127.0.0.1:40112 - "GET /health HTTP/1.1" 200 OK',
        f"[{ts} TP0] Decode batch, #running-req: {step % 48 + 1}, #token: {1600 + step}, "
        f"token usage: 0.01, accept len: 5.{step % 10}1, accept rate: 0.72, cuda graph: True, "
        f"gen throughput (token/s): {310 + step % 89}.40, #queue-req: 0",
        f"[{ts} TP0] Cache flushed successfully!" if step % 97 == 0 else f"[{ts}] Health ok",
        f"[{ts} TP{step % 8}] Decode batch, #running-req: 2, #token: 90, token usage: 0.00, "
        f"accept len: 3.90, accept rate: 0.61, cuda graph: True, "
        f"gen throughput (token/s): 150.00, #queue-req: 0",
        f"[{ts}] The tokenizer of the model does not set a chat template; using default.",
        f'[{ts}] INFO:     10.0.0.7:51234 - "POST /generate HTTP/1.1" 200 OK',
    ]


def build_mix(total: int) -> list[str]:
    startup = [
        line
        for path in sorted(FIXTURES.glob("*.log"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]
    lines: list[str] = []
    for step in itertools.count():
        if step % 400 == 0:
            lines.extend(startup)  # a restart: phases, bars, tracebacks
        lines.extend(serving_block(step))
        if len(lines) >= total:
            return lines[:total]
    return lines


def time_parse(lines: list[str]) -> tuple[float, int]:
    parser = LogParser()
    events = 0
    start = time.perf_counter()
    for line in lines:
        events += len(parser.feed(line))
    events += len(parser.finish())
    return time.perf_counter() - start, events


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--lines", type=int, default=250_000)
    args.add_argument("--log", type=Path, help="parse this log instead of the generated mix")
    args.add_argument("--repeat", type=int, default=3, help="best of N runs")
    opts = args.parse_args()
    if opts.log:
        lines = opts.log.read_text(encoding="utf-8", errors="replace").splitlines()
    else:
        lines = build_mix(opts.lines)
    best, events = min(time_parse(lines) for _ in range(opts.repeat))
    rate = len(lines) / best
    print(f"lines: {len(lines)}  events: {events}  best of {opts.repeat}: {best:.3f} s")
    print(f"throughput: {rate:,.0f} lines/s  ({rate / TARGET_LINES_PER_S:.2f}x the "
          f"{TARGET_LINES_PER_S:,} lines/s target)")


if __name__ == "__main__":
    main()
