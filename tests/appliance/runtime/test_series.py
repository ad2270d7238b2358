"""Tests for appliance.runtime.series: points from SGLang's real /metrics text, and their
downsampling (the bounded storage keeps one point per minute after the first hour)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.engine.metrics import parse_metrics, window_summary
from appliance.runtime.series import SCALARS, UNITS, Deriver, MetricPoint, downsample, merge

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


@pytest.fixture()
def tp8_text() -> str:
    return (FIXTURE / "sglang_0523_dflash_tp8.txt").read_text(encoding="utf-8")


def _set(text: str, sample: str, value: float) -> str:
    """Replace one sample's value (its full name and labels, as the fixture spells them)."""
    pattern = re.compile(rf"^{re.escape(sample)} \S+$", re.M)
    assert pattern.search(text), sample
    return pattern.sub(f"{sample} {value}", text)


def _slow_itl(text: str, n: int) -> str:
    """n more inter-token latencies, all in the (0.035, 0.04] bucket."""
    def bump(match: re.Match[str]) -> str:
        le, count = match.group(1), float(match.group(2))
        bound = float("inf") if le == "+Inf" else float(le)
        return f'{match.group(0).rsplit(" ", 1)[0]} {count + n if bound >= 0.04 else count}'

    text = re.sub(r'^sglang:inter_token_latency_seconds_bucket\{model_name="kimi-k2.6",'
                  r'le="([^"]+)"\} (\S+)$', bump, text, flags=re.M)
    count = 'sglang:inter_token_latency_seconds_count{model_name="kimi-k2.6"}'
    old = float(re.search(rf"^{re.escape(count)} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    return _set(text, count, old + n)


GEN = 'sglang:generation_tokens_total{is_streaming="true",model_name="kimi-k2.6"}'
PROMPT = 'sglang:prompt_tokens_total{is_streaming="true",model_name="kimi-k2.6"}'


def test_output_throughput_is_the_token_counter_rate_between_two_scrapes(tp8_text: str) -> None:
    deriver = Deriver()
    deriver.derive(100.0, parse_metrics(tp8_text))
    later = _set(_set(tp8_text, GEN, 204800.0 + 606), PROMPT, 51200.0 + 1024)
    point = deriver.derive(102.0, parse_metrics(later))
    assert point.throughput == pytest.approx(303.0)
    assert point.input_throughput == pytest.approx(512.0)


def test_a_point_carries_what_the_engine_reports_for_eight_tp_ranks(tp8_text: str) -> None:
    point = Deriver().derive(100.0, parse_metrics(tp8_text), [[97.0, 120.5, 143.8]])
    assert (point.running, point.queued) == (3.0, 1.0)
    assert (point.accept_len, point.accept_rate) == (4.87, 0.7)
    assert point.kv_usage == 0.02 and point.cuda_graph == 1.0
    assert point.gpus == [[97.0, 120.5, 143.8]]
    # The first scrape has no rate yet: the gauge stands in only without a counter.
    assert point.throughput is None


def test_latency_percentiles_describe_the_window_not_the_engines_whole_life(
        tp8_text: str) -> None:
    deriver = Deriver(latency_window_s=30)
    first = deriver.derive(100.0, parse_metrics(tp8_text))
    assert first.itl_p50 is not None and first.itl_p50 < 0.01  # since start: fast tokens
    later = deriver.derive(102.0, parse_metrics(_slow_itl(tp8_text, 100)))
    # The 100 tokens of the last two seconds were all slow: the window says so.
    assert later.itl_p50 == pytest.approx(0.0375)
    assert later.itl_p99 is not None and 0.035 < later.itl_p99 <= 0.04
    # No request finished in the window: no TTFT figure rather than a stale one.
    assert later.ttft_p50 is None


def test_an_idle_engine_reports_no_acceptance_and_zero_throughput(tp8_text: str) -> None:
    idle = _set(tp8_text, 'sglang:num_running_reqs{engine_type="unified",model_name="kimi-k2.6",'
                'moe_ep_rank="0",pp_rank="0",tp_rank="0"}', 0.0)
    deriver = Deriver()
    deriver.derive(100.0, parse_metrics(idle))
    point = deriver.derive(102.0, parse_metrics(idle))
    assert point.throughput == 0.0
    assert point.accept_len is None and point.accept_rate is None
    # is_cuda_graph speaks of the last batch: idle, there is no graph share to report.
    assert point.cuda_graph is None


def test_a_counter_that_went_back_means_a_restarted_engine_not_a_negative_rate(
        tp8_text: str) -> None:
    deriver = Deriver()
    deriver.derive(100.0, parse_metrics(tp8_text))
    point = deriver.derive(102.0, parse_metrics(_set(tp8_text, GEN, 10.0)))
    assert point.throughput is None


def test_a_window_of_a_reset_histogram_is_the_newer_one_alone(tp8_text: str) -> None:
    snap = parse_metrics(tp8_text)
    empty = parse_metrics("")
    assert window_summary(empty.itl, snap.itl) is empty.itl


def test_downsampling_merges_each_minute_into_its_mean() -> None:
    points = [MetricPoint(t=60.0 * 10 + i * 2, throughput=100.0 + i, accept_len=None if i % 2
                          else 4.0, cuda_graph=1.0 if i < 15 else 0.0,
                          gpus=[[50.0, 10.0, 80.0]]) for i in range(60)]
    rolled = downsample(points, 60)
    assert [p.t for p in rolled] == [600.0, 660.0]
    first = rolled[0]
    assert first.throughput == pytest.approx(100.0 + 14.5)  # i = 0..29
    assert first.accept_len == 4.0  # gaps (None) do not drag the mean down
    assert first.cuda_graph == pytest.approx(0.5)  # the share of samples on graphs
    assert first.gpus == [[50.0, 10.0, 80.0]]


def test_merging_gpu_rows_keeps_the_latest_shape() -> None:
    merged = merge([MetricPoint(t=0, gpus=[[10.0, 1.0, 2.0]]),
                    MetricPoint(t=1, gpus=[[20.0, 1.0, 2.0], [30.0, 3.0, 4.0]]),
                    MetricPoint(t=2, gpus=[[40.0, None, 2.0], [50.0, 5.0, 4.0]])], t=0)
    assert merged.gpus == [[30.0, 1.0, 2.0], [40.0, 4.0, 4.0]]


def test_every_scalar_field_has_a_unit_and_round_trips_through_a_dict() -> None:
    point = MetricPoint(t=1.0, **{name: float(i) for i, name in enumerate(SCALARS)})
    assert set(UNITS) == set(SCALARS)
    assert MetricPoint.from_dict({**point.to_dict(), "unknown": 1}) == point
