"""`appliance bench`: a concurrency sweep against any OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from appliance.bench.client import CHAT, COMPLETIONS
from appliance.bench.metrics import LevelMetrics
from appliance.bench.prompts import PromptError, load_prompts
from appliance.bench.runner import BenchOptions, BenchUnreachable, Target, run_benchmark


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError("a comma-separated list of integers") from exc
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels must be positive integers")
    return levels


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cmd = sub.add_parser("bench", help="benchmark an OpenAI-compatible streaming server")
    cmd.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:30000")
    cmd.add_argument("--concurrency", type=_levels, default=(1, 2, 4, 8, 16, 32, 64))
    cmd.add_argument("--input-len", type=int, default=512)
    cmd.add_argument("--output-len", type=int, default=256)
    cmd.add_argument("--num-prompts", type=int, default=64, help="requests per level")
    cmd.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals/s")
    cmd.add_argument("--duration", type=float, default=None, help="seconds per level (cap)")
    cmd.add_argument("--warmup", type=int, default=1)
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--model", default="", help="default: the first of /v1/models")
    cmd.add_argument("--endpoint", choices=(CHAT, COMPLETIONS), default=CHAT)
    cmd.add_argument("--prompts", type=Path, help="JSONL of prompts or a ShareGPT JSON file")
    cmd.add_argument("--prompt-format", choices=("jsonl", "sharegpt"), default="jsonl")
    cmd.add_argument("--json", action="store_true", help="the figures as JSON")
    cmd.set_defaults(func=cmd_bench)


HEADER = (f"{'conc':>5} {'ok':>5} {'err':>4} {'req/s':>8} {'out tok/s':>10} "
          f"{'TTFT ms':>9} {'p99':>8} {'TPOT ms':>8} {'p99':>7} {'ITL ms':>7} {'p99':>7} "
          f"{'E2E ms':>9} {'accept':>6}")


def _row(m: LevelMetrics) -> str:
    accept = m.request_accept_len or m.accept_len
    return (f"{m.concurrency:>5} {m.completed:>5} {m.errors:>4} {m.request_throughput:>8.2f} "
            f"{m.output_throughput:>10.1f} {m.ttft_ms.mean:>9.1f} {m.ttft_ms.p99:>8.1f} "
            f"{m.tpot_ms.mean:>8.2f} {m.tpot_ms.p99:>7.2f} {m.itl_ms.mean:>7.2f} "
            f"{m.itl_ms.p99:>7.2f} {m.e2e_ms.mean:>9.1f} "
            f"{'-' if accept is None else f'{accept:.2f}':>6}")


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        prompts = load_prompts(
            source=args.prompt_format if args.prompts else "synthetic", count=args.num_prompts,
            input_len=args.input_len, output_len=args.output_len, seed=args.seed,
            text=args.prompts.read_text() if args.prompts else "")
    except PromptError as exc:
        print(f"error  {exc.field}: {exc}", file=sys.stderr)
        return 2
    options = BenchOptions(levels=args.concurrency, warmup=args.warmup, seed=args.seed,
                           request_rate=args.request_rate, duration_s=args.duration)
    target = Target("server", args.url.rstrip("/"), args.model, args.endpoint)
    try:
        result = run_benchmark([target], prompts, options)
    except BenchUnreachable as exc:
        print(f"error  {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(HEADER)
        for step in result.steps:
            print(_row(step.metrics))
        sources = {s.metrics.token_source for s in result.steps}
        print(f"output tokens counted from: {', '.join(sorted(sources))}")
    return 0 if all(s.metrics.completed for s in result.steps) else 1
