"""Tests for appliance.runtime.alerts: each alert fires once when its condition starts and
resolves once when it ends."""

from __future__ import annotations

import pytest

from appliance.runtime.alerts import AlertRules, AlertWatch
from appliance.runtime.series import MetricPoint


def _accept(watch: AlertWatch, values: list[float]) -> list[tuple[str, str]]:
    out = []
    for i, value in enumerate(values):
        out += [(a.id, a.state) for a in watch.point(MetricPoint(t=i, accept_len=value))]
    return out


def test_acceptance_collapse_fires_once_well_below_its_own_baseline_and_resolves() -> None:
    watch = AlertWatch(AlertRules(baseline_points=10, collapse_points=3))
    assert _accept(watch, [4.9, 4.8, 5.0, 4.85] * 3) == []
    assert watch.baseline is not None and 4.8 < watch.baseline < 5.0
    assert _accept(watch, [1.3, 1.2]) == []  # two low points: not yet
    assert _accept(watch, [1.25, 1.3, 1.2]) == [("accept-collapse", "firing")]
    assert _accept(watch, [4.7, 4.8]) == []
    assert _accept(watch, [4.9]) == [("accept-collapse", "resolved")]


def test_the_collapse_alert_names_the_value_and_the_baseline() -> None:
    watch = AlertWatch(AlertRules(baseline_points=2, collapse_points=1))
    _accept(watch, [5.0, 5.0])
    [alert] = watch.point(MetricPoint(t=9, accept_len=1.5))
    assert alert.evidence == {"accept_len": 1.5, "baseline": 5.0}
    assert "1.50" in alert.summary and "5.00" in alert.summary
    assert alert.severity == "warning" and "drafter" in alert.fix


def test_a_lower_but_not_collapsed_acceptance_only_moves_the_baseline() -> None:
    watch = AlertWatch(AlertRules(baseline_points=5))
    assert _accept(watch, [5.0] * 5 + [4.0] * 20) == []  # 80 % of the baseline: a drift
    assert watch.baseline is not None and watch.baseline < 4.2


def test_no_acceptance_while_idle_neither_fires_nor_learns() -> None:
    watch = AlertWatch(AlertRules(baseline_points=2, collapse_points=1))
    _accept(watch, [5.0, 5.0])
    assert watch.point(MetricPoint(t=5, accept_len=None)) == []
    assert watch.baseline == 5.0


def test_a_stall_fires_after_quiet_seconds_while_loading_and_progress_resolves_it() -> None:
    watch = AlertWatch(AlertRules(stall_s=30), now=0.0)
    assert watch.tick("loading", 10.0) == []
    assert watch.tick("loading", 39.0) == []  # quiet since the status began at 10 s
    [alert] = watch.tick("loading", 41.0)
    assert (alert.id, alert.state, alert.evidence["status"]) == ("stall", "firing", "loading")
    assert watch.tick("loading", 50.0) == []  # still firing: said once
    resolved = watch.events([("progress", {"kind": "weights_progress", "done": 3})], 51.0)
    assert [(a.id, a.state) for a in resolved] == [("stall", "resolved")]


def test_the_agents_own_health_polls_in_the_engine_log_are_not_progress() -> None:
    watch = AlertWatch(AlertRules(stall_s=5), now=0.0)
    watch.tick("capturing", 0.0)
    access = 'INFO:     172.18.0.3:41234 - "GET /health HTTP/1.1" 503 Service Unavailable'
    assert watch.events([("log", {"stream": "stdout", "text": access})], 4.0) == []
    assert [a.id for a in watch.tick("capturing", 6.0)] == ["stall"]


def test_there_is_no_stall_while_ready_and_a_ready_engine_resolves_one() -> None:
    watch = AlertWatch(AlertRules(stall_s=5), now=0.0)
    assert watch.tick("ready", 100.0) == []
    watch.tick("capturing", 100.0)
    assert [a.state for a in watch.tick("capturing", 106.0)] == ["firing"]
    assert [a.state for a in watch.tick("ready", 107.0)] == ["resolved"]


def test_kv_usage_above_95_percent_fires_and_below_90_resolves() -> None:
    watch = AlertWatch()
    assert [a.id for a in watch.point(MetricPoint(t=0, kv_usage=0.97))] == ["kv-high"]
    assert watch.point(MetricPoint(t=1, kv_usage=0.93)) == []  # between: no flapping
    assert [a.state for a in watch.point(MetricPoint(t=2, kv_usage=0.5))] == ["resolved"]


def test_an_unreachable_metrics_endpoint_fires_after_three_failures_and_heals() -> None:
    watch = AlertWatch(AlertRules(unreachable_after=3))
    assert watch.scrape_failed("refused") == [] and watch.scrape_failed("refused") == []
    [alert] = watch.scrape_failed("GET /metrics answered 404")
    assert alert.severity == "critical" and "404" in alert.summary
    assert watch.scrape_failed("refused") == []
    assert [a.state for a in watch.point(MetricPoint(t=0))] == ["resolved"]


def test_silent_eager_fires_from_the_diagnosis_and_resolves_after_graph_lines() -> None:
    watch = AlertWatch(AlertRules(eager_clear_lines=2))
    diagnosis = {"cause": "silent-eager-verify", "summary": "verify runs without CUDA graphs",
                 "fix": "capture the verify graph at the tree's width", "evidence": {"bs": 1}}
    [alert] = watch.events([("diagnosis", diagnosis)], 0.0)
    assert (alert.id, alert.summary, alert.evidence) == (
        "silent-eager", "verify runs without CUDA graphs", {"bs": 1})
    graph = {"kind": "decode_stats", "accept_len": 4.1, "cuda_graph": True}
    eager = {**graph, "cuda_graph": False}
    assert watch.events([("metric", graph), ("metric", eager), ("metric", graph)], 1.0) == []
    resolved = watch.events([("metric", graph)], 2.0)
    assert [(a.id, a.state) for a in resolved] == [("silent-eager", "resolved")]


def test_a_watch_started_with_firing_alerts_does_not_fire_them_again() -> None:
    watch = AlertWatch(AlertRules(stall_s=1), active=["stall"], now=0.0)
    watch.tick("loading", 0.0)
    assert watch.tick("loading", 5.0) == []
    assert [a.state for a in watch.tick("ready", 6.0)] == ["resolved"]


def _shares(watch: AlertWatch, shares: list[float | None], running: float = 4.0
            ) -> list[tuple[str, str]]:
    out = []
    for i, share in enumerate(shares):
        point = MetricPoint(t=i, cuda_graph=share, running=running)
        out += [(a.id, a.state) for a in watch.point(point)]
    return out


def test_silent_eager_fires_from_the_pass_counters_share_and_resolves_on_graphs() -> None:
    watch = AlertWatch(AlertRules(eager_points=3))
    # Idle windows (no decode pass: no share) neither count nor break a run.
    assert _shares(watch, [1.0, None, 0.2, None, 0.1]) == []
    assert _shares(watch, [0.0]) == [("silent-eager", "firing")]
    assert _shares(watch, [0.0, 1.0, 0.95]) == []
    assert _shares(watch, [1.0]) == [("silent-eager", "resolved")]


def test_graphs_off_by_the_spec_is_an_info_note_not_a_silent_eager_fault() -> None:
    off = AlertWatch(AlertRules(eager_points=1, expect_cuda_graph=False))
    assert _shares(off, [0.0, 0.0]) == [("eager-by-spec", "firing")]
    note = off.point(MetricPoint(t=9, cuda_graph=0.0))
    assert note == []  # raised once
    assert "silent-eager" not in off.active


def test_batches_above_the_captured_size_say_so_and_not_silent_eager() -> None:
    big = AlertWatch(AlertRules(eager_points=1))
    big.events([("progress", {"kind": "capture_progress", "bs": 48})], 0.0)
    assert _shares(big, [0.0, 0.0], running=64.0) == [("eager-above-max-bs", "firing")]
    assert _shares(big, [1.0], running=8.0) == [("eager-above-max-bs", "resolved")]
    assert _shares(big, [0.0], running=32.0) == [("silent-eager", "firing")]


def test_the_metrics_alert_names_the_recipe_only_when_the_capture_showed_a_width_mismatch(
        ) -> None:
    [alert] = AlertWatch(AlertRules(eager_points=1)).point(
        MetricPoint(t=0, cuda_graph=0.0, running=1.0))
    assert "recipe" in alert.fix and "kimi-k2.6-ddtree" not in alert.fix
    wrong = AlertWatch(AlertRules(eager_points=1))
    wrong.events([("progress", {"kind": "capture_begin", "role": "target", "mode": "verify",
                                "num_tokens_per_req": 8, "needed_tokens_per_req": 33})], 0.0)
    [alert] = wrong.point(MetricPoint(t=1, cuda_graph=0.0, running=1.0))
    assert "captured 8 tokens wide and the tree needs 33" in alert.summary
    assert "kimi-k2.6-ddtree" in alert.fix


@pytest.mark.parametrize(("cause", "alert_id", "severity"), [
    ("silent-eager-verify", "silent-eager", "warning"),
    ("cuda-graphs-disabled", "eager-by-spec", "info"),
    ("eager-above-max-bs", "eager-above-max-bs", "info"),
])
def test_each_eager_cause_of_the_log_raises_its_own_alert(cause: str, alert_id: str,
                                                          severity: str) -> None:
    watch = AlertWatch()
    [alert] = watch.events([("diagnosis", {"cause": cause, "summary": "s", "fix": "f",
                                           "evidence": {}})], 0.0)
    assert (alert.id, alert.severity, alert.summary, alert.fix) == (alert_id, severity, "s", "f")


def test_graph_backed_log_lines_do_not_clear_what_the_pass_counters_still_show() -> None:
    watch = AlertWatch(AlertRules(eager_points=1, eager_clear_lines=1))
    assert _shares(watch, [0.0]) == [("silent-eager", "firing")]
    graph = {"kind": "decode_stats", "accept_len": 1.1, "cuda_graph": True}
    assert watch.events([("metric", graph)] * 3, 1.0) == []
    assert _shares(watch, [1.0]) == [("silent-eager", "resolved")]


def test_once_the_log_says_graphs_are_off_by_the_spec_the_pass_counters_raise_no_fault(
        ) -> None:
    watch = AlertWatch(AlertRules(eager_points=1))  # told nothing of the spec
    [note] = watch.events([("diagnosis", {"cause": "cuda-graphs-disabled", "summary": "off",
                                          "fix": "cost", "evidence": {}})], 0.0)
    assert (note.id, note.severity) == ("eager-by-spec", "info")
    assert _shares(watch, [0.0, 0.0, 0.0]) == []
