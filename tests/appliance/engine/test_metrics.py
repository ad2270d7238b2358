"""Tests for appliance.engine.metrics.

Metric names and labels follow sglang 0.5.23 srt/observability/metrics_collector.py:
scheduler gauges (sglang:num_running_reqs, gen_throughput, token_usage, cache_hit_rate,
spec_accept_length, spec_accept_rate, is_cuda_graph, weight_load_duration_seconds) carry
model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+ dp_rank); the tokenizer's
counters (prompt_tokens_total, generation_tokens_total) and histograms
(time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds)
carry model_name and is_streaming.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.engine.metrics import histogram_quantile, parse_metrics

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


@pytest.fixture()
def tp8_text() -> str:
    return (FIXTURE / "sglang_0523_dflash_tp8.txt").read_text(encoding="utf-8")


def test_it_reads_the_scheduler_gauges_once_for_eight_tp_ranks(tp8_text: str) -> None:
    snap = parse_metrics(tp8_text)
    assert snap.num_running_reqs == 3.0  # not 8 x 3: TP ranks repeat one scheduler state
    assert snap.gen_throughput == 303.12
    assert (snap.spec_accept_length, snap.spec_accept_rate) == (4.87, 0.7)
    assert snap.is_cuda_graph is True
    assert snap.model_names == ["kimi-k2.6"]


def test_it_sums_token_counters_over_streaming_and_non_streaming(tp8_text: str) -> None:
    snap = parse_metrics(tp8_text)
    assert snap.prompt_tokens_total == 51200.0 + 1024.0
    assert snap.generation_tokens_total == 204800.0 + 4096.0


def test_it_merges_histogram_series_before_estimating_quantiles(tp8_text: str) -> None:
    ttft = parse_metrics(tp8_text).ttft
    assert ttft.count == 110.0
    # merged cumulative counts: le 0.2 -> 10, le 0.4 -> 55: rank 55 sits at 0.4 exactly
    assert ttft.p50 == pytest.approx(0.4)
    assert ttft.p50 is not None and ttft.p90 is not None and ttft.p99 is not None
    assert ttft.p50 <= ttft.p90 <= ttft.p99


def test_a_quantile_is_interpolated_linearly_inside_its_bucket() -> None:
    buckets = [(1.0, 10.0), (2.0, 30.0), (float("inf"), 40.0)]
    # rank 20 of 40 lies halfway through the (1, 2] bucket's 20 observations
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)
    # rank 4 lies in the first bucket, interpolated from 0
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.4)


def test_a_quantile_in_the_open_top_bucket_is_the_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(1.0, 1.0), (float("inf"), 10.0)]) == 1.0


def test_an_empty_histogram_has_no_quantiles() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_dp_groups_are_summed_for_counts_and_averaged_for_ratios() -> None:
    text = "\n".join(
        [
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 4.0',
            'sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 4.0',
            'sglang:num_running_reqs{dp_rank="1",tp_rank="0"} 6.0',
            "# TYPE sglang:token_usage gauge",
            'sglang:token_usage{dp_rank="0",tp_rank="0"} 0.2',
            'sglang:token_usage{dp_rank="1",tp_rank="0"} 0.4',
            "# TYPE sglang:is_cuda_graph gauge",
            'sglang:is_cuda_graph{dp_rank="0",tp_rank="0"} 1.0',
            'sglang:is_cuda_graph{dp_rank="1",tp_rank="0"} 0.0',
            "",
        ]
    )
    snap = parse_metrics(text)
    assert snap.num_running_reqs == 10.0
    assert snap.token_usage == pytest.approx(0.3)
    assert snap.is_cuda_graph is False  # one eager group is the silent-eager fault


def test_metrics_the_engine_did_not_report_stay_none() -> None:
    snap = parse_metrics("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 0.0\n")
    assert snap.num_queue_reqs == 0.0
    assert snap.spec_accept_length is None and snap.is_cuda_graph is None
    assert snap.ttft.count == 0.0 and snap.ttft.p50 is None


def test_the_snapshot_dict_nests_histogram_summaries(tp8_text: str) -> None:
    data = parse_metrics(tp8_text).to_dict()
    assert set(data["itl"]) == {"count", "sum", "mean", "p50", "p90", "p99"}
    assert data["itl"]["count"] == 10000.0
