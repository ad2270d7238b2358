"""Benchmark figures and prompt sources, without a server; a target nobody answers at."""

from __future__ import annotations

import argparse
import json

import pytest

from appliance.bench import BenchOptions, PromptError, Target, load_prompts, plan_steps
from appliance.bench.cli import cmd_bench
from appliance.bench.client import RequestResult
from appliance.bench.metrics import level_metrics, percentile
from appliance.bench.runner import (
    BenchUnreachable,
    RunResult,
    StepResult,
    run_benchmark,
    speedups,
    verdict_words,
)
from tests.servers import free_port


def test_percentile_interpolates_as_numpy_does() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([], 99) == 0.0


def test_tpot_excludes_the_first_token_and_itl_is_per_chunk() -> None:
    r = RequestResult(ok=True, ttft=0.1, latency=0.5, itl=[0.1, 0.2, 0.1], output_len=5,
                      token_source="usage")
    m = level_metrics(concurrency=1, results=[r, RequestResult(error="boom")], duration_s=2.0,
                      accept_len=3.5)
    assert m.tpot_ms.mean == pytest.approx(100.0)
    assert m.itl_ms.mean == pytest.approx(400 / 3)
    assert (m.completed, m.errors, m.first_error) == (1, 1, "boom")
    assert m.output_throughput == 2.5 and m.request_throughput == 0.5


def test_it_reads_jsonl_and_sharegpt_prompts() -> None:
    jsonl = '{"prompt": "a b c", "output_len": 7}\n"just text"\n'
    prompts = load_prompts(source="jsonl", count=2, input_len=0, output_len=9, seed=0,
                           text=jsonl)
    assert sorted(p.output_len for p in prompts) == [7, 9]
    share = json.dumps([{"conversations": [{"from": "human", "value": "hi there"},
                                           {"from": "gpt", "value": "one two three four five"}]}])
    (p,) = load_prompts(source="sharegpt", count=1, input_len=0, output_len=0, seed=0,
                        text=share, fixed_output=False)
    assert (p.text, p.output_len) == ("hi there", 5)


def test_it_names_the_field_of_a_bad_prompt_file() -> None:
    with pytest.raises(PromptError) as exc:
        load_prompts(source="jsonl", count=1, input_len=0, output_len=9, seed=0, text="{oops")
    assert exc.value.field == "prompts"


def test_interleaved_runs_each_level_against_every_target_in_turn() -> None:
    a, b = Target("a", "http://a"), Target("b", "http://b")
    steps = plan_steps([a, b], [1, 4], "interleaved")
    assert [(t.name, c) for t, c in steps] == [("a", 1), ("b", 1), ("a", 4), ("b", 4)]


def test_speedup_is_throughput_and_tpot_against_the_baseline() -> None:
    def step(target: str, thr: float, tpot: float) -> StepResult:
        r = RequestResult(ok=True, ttft=0.0, latency=tpot * 10, output_len=11)
        return StepResult(target, level_metrics(concurrency=1, results=[r],
                                                duration_s=11 / thr, accept_len=None))
    rows = speedups(RunResult([step("base", 100, 0.02), step("fast", 200, 0.01)]), "base")
    assert rows[0]["throughput_ratio"] == pytest.approx(2.0)
    assert rows[0]["tpot_ratio"] == pytest.approx(2.0)
    assert rows[0]["verdict"] == "fast 2.00x faster than base at concurrency 1"


@pytest.mark.parametrize(("ratio", "words"), [
    (2.0, "2.00x faster than base"), (0.5, "2.00x slower than base"),
    (0.998, "as fast as base (1.00x)"), (1.004, "as fast as base (1.00x)"),
    (0.99, "1.01x slower than base"), (1.01, "1.01x faster than base"),
    (0.0, "produced no output, against base")])
def test_a_ratio_reads_as_words_and_one_that_rounds_to_1x_is_never_slower(
        ratio: float, words: str) -> None:
    assert verdict_words(ratio, "base") == words


def test_a_target_nobody_listens_at_stops_the_run_before_its_first_level() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    prompts = load_prompts(source="synthetic", count=2, input_len=4, output_len=4, seed=0)
    with pytest.raises(BenchUnreachable) as caught:
        run_benchmark([Target("a", url)], prompts, BenchOptions(levels=(1, 2)))
    assert str(caught.value).startswith(f"cannot reach a at {url}: ClientConnectorError")


def test_the_cli_says_which_url_it_cannot_reach(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    args = argparse.Namespace(prompts=None, prompt_format="jsonl", num_prompts=2, input_len=4,
                              output_len=4, seed=0, concurrency=(1,), warmup=0,
                              request_rate=None, duration=None, url=url, model="",
                              endpoint="/v1/chat/completions", json=False)
    assert cmd_bench(args) == 1
    assert f"error  cannot reach server at {url}: " in capsys.readouterr().err
