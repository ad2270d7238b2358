"""The benchmark client measures what a server with exact token pacing does: TTFT and TPOT
within 2% of what the server really did, at concurrency 1 and 8.

The truth is the server's own record of each stream (from the request's arrival to its
first token, and the mean gap after), not the configured pacing: on a loaded two-core CI
machine the server's event loop wakes a few milliseconds late (a CI run saw TTFT 204.3 ms
for 200 configured), which is the machine, not the client mismeasuring. The configured
values still bound the record from below and, loosely, from above. One warm-up request per
stream opens the connections first, as a real benchmark's warm-up does, so the 2% is not
seven TCP handshakes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from appliance.bench import BenchOptions, Target, load_prompts, run_benchmark

TTFT_S, TPOT_S, OUTPUT_LEN = 0.2, 0.01, 32
# Timings within 2 %: another worker's test on the same cores skews them (pytest-xdist).
pytestmark = pytest.mark.exclusive


@pytest.fixture(scope="module")
def paced_url() -> Iterator[str]:
    # Its own process, so the server's pacing does not share a GIL with the client.
    proc = subprocess.Popen([sys.executable, "-m", "appliance.bench.paced", str(TTFT_S),
                             str(TPOT_S)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_it_measures_ttft_and_tpot_within_two_percent(paced_url: str, concurrency: int) -> None:
    prompts = load_prompts(source="synthetic", count=(6 if concurrency == 1 else 4 * concurrency), input_len=64,
                           output_len=OUTPUT_LEN, seed=1)
    server_actual(paced_url)  # forget earlier tests' streams
    result = run_benchmark([Target("paced", paced_url)], prompts,
                           BenchOptions(levels=(concurrency,), warmup=concurrency))
    m = result.steps[0].metrics
    streams = server_actual(paced_url)
    assert len(streams) == concurrency + len(prompts)  # the warm-ups, then the measured ones
    actual = streams[concurrency:]  # the warm-up requests finished first
    ttft_ms = 1000 * sum(a["ttft_s"] for a in actual) / len(actual)
    tpot_ms = 1000 * sum(a["tpot_s"] for a in actual) / len(actual)
    print(f"c={concurrency} TTFT {m.ttft_ms.mean:.2f} ms (server {ttft_ms:.2f},"
          f" {m.ttft_ms.mean / ttft_ms - 1:+.2%}) TPOT {m.tpot_ms.mean:.3f} ms"
          f" (server {tpot_ms:.3f}, {m.tpot_ms.mean / tpot_ms - 1:+.2%})")
    assert m.completed == len(prompts) and m.errors == 0
    assert TTFT_S * 1000 <= ttft_ms < TTFT_S * 1000 * 1.1
    assert TPOT_S * 1000 * 0.98 <= tpot_ms < TPOT_S * 1000 * 1.1
    assert m.ttft_ms.mean == pytest.approx(ttft_ms, rel=0.02)
    assert m.tpot_ms.mean == pytest.approx(tpot_ms, rel=0.02)
    assert m.itl_ms.mean == pytest.approx(tpot_ms, rel=0.02)
    assert m.token_source == "usage" and m.total_output_tokens == OUTPUT_LEN * len(prompts)
    expected_thr = OUTPUT_LEN * concurrency / (TTFT_S + (OUTPUT_LEN - 1) * TPOT_S)
    assert m.output_throughput == pytest.approx(expected_thr, rel=0.05)


def server_actual(url: str) -> list[dict[str, float]]:
    with urllib.request.urlopen(url + "/paced/actual", timeout=10) as resp:
        return list(json.load(resp))
