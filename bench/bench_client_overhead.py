"""The benchmark client's own overhead at concurrency 64 against a zero-delay loopback
server (appliance.bench.paced in its own process, tokens sent as fast as it can).

Prints what the client costs: CPU seconds per request and per streamed chunk, the
chunks/s one client process sustains, and the TTFT/ITL it measures when the server adds
no delay (an upper bound on what the client adds to each figure).

    .venv/bin/python bench/bench_client_overhead.py [--concurrency 64] [--requests 512]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from appliance.bench import BenchOptions, Target, load_prompts, run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "appliance.bench.paced", "0", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        prompts = load_prompts(source="synthetic", count=args.requests, input_len=128,
                               output_len=args.output_len, seed=0)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = run_benchmark([Target("loopback", url)], prompts,
                               BenchOptions(levels=(args.concurrency,), warmup=1))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        server.terminate()
        server.wait(10)
    m = result.steps[0].metrics
    chunks = m.total_output_tokens
    print(f"concurrency {args.concurrency}, {m.completed} requests x {args.output_len} chunks, "
          f"{m.errors} errors")
    print(f"client CPU: {cpu:.2f} s over {wall:.2f} s wall "
          f"({cpu / m.completed * 1e3:.3f} ms/request, {cpu / chunks * 1e6:.1f} us/chunk)")
    print(f"sustained: {m.request_throughput:.0f} req/s, {m.output_throughput:.0f} chunks/s")
    print(f"measured with a zero-delay server: TTFT mean {m.ttft_ms.mean:.2f} ms "
          f"p99 {m.ttft_ms.p99:.2f} ms; ITL mean {m.itl_ms.mean:.3f} ms p99 "
          f"{m.itl_ms.p99:.3f} ms; TPOT mean {m.tpot_ms.mean:.3f} ms")


if __name__ == "__main__":
    main()
