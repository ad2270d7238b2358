"""The benchmark client measures what a server with exact token pacing does: TTFT and TPOT
within 2% of the configured values at concurrency 1 and 8."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from appliance.bench import BenchOptions, Target, load_prompts, run_benchmark

TTFT_S, TPOT_S, OUTPUT_LEN = 0.2, 0.01, 32


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
    result = run_benchmark([Target("paced", paced_url)], prompts,
                           BenchOptions(levels=(concurrency,), warmup=1))
    m = result.steps[0].metrics
    print(f"c={concurrency} TTFT {m.ttft_ms.mean:.2f} ms ({m.ttft_ms.mean / 1e3 / TTFT_S - 1:+.2%})"
          f" TPOT {m.tpot_ms.mean:.3f} ms ({m.tpot_ms.mean / 1e3 / TPOT_S - 1:+.2%})")
    assert m.completed == len(prompts) and m.errors == 0
    assert m.ttft_ms.mean == pytest.approx(TTFT_S * 1000, rel=0.02)
    assert m.tpot_ms.mean == pytest.approx(TPOT_S * 1000, rel=0.02)
    assert m.itl_ms.mean == pytest.approx(TPOT_S * 1000, rel=0.02)
    assert m.token_source == "usage" and m.total_output_tokens == OUTPUT_LEN * len(prompts)
    expected_thr = OUTPUT_LEN * concurrency / (TTFT_S + (OUTPUT_LEN - 1) * TPOT_S)
    assert m.output_throughput == pytest.approx(expected_thr, rel=0.05)
