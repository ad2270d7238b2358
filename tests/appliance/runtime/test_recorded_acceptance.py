"""The appliance reads acceptance right on the real engine's recordings, the trained pair's
above all (tests/fixtures/real-engine/433c58ed7/trained_*: a drafter that accepts 3.8 to 4.9
tokens a step, and the same drafter on a target it was not trained for, 1.04).

Each run's recorded /metrics scrapes go through the series' Deriver, as the agent's
monitor derives the chart points, and its alerts:
- the accept-length chart over the bench (its points pooled per verify step: each point's
  tokens over its accept length) within 5 % of the bench's own accept length (SGLang's,
  per level, pooled alike);
- the acceptance alert (accept-low) fires on the wrong drafter's run, naming the drafter
  and the fix, and on no run of a trained drafter.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from appliance.engine.metrics import parse_metrics
from appliance.runtime.alerts import LOW_ACCEPT_LEN, AlertRules, AlertWatch
from appliance.runtime.logstream import parse_docker_ts
from appliance.runtime.series import Deriver, MetricPoint
from tests.real_engine import ROOT

SOURCE = ROOT / "433c58ed7"
TRAINED = sorted(p.name for p in SOURCE.glob("trained_*") if (p / "bench.json").is_file()
                 and (p / "metrics.jsonl.gz").is_file())
# The wrong drafter's run where it is recorded, else the random-weight DFLASH run (a drafter
# no more trained for its target).
WRONG = "trained_wrong" if "trained_wrong" in TRAINED else "dflash_triton"
SPECULATIVE = [r for r in TRAINED if r not in ("trained_base",)] or ["ddtree_triton",
                                                                     "dflash_triton"]


def _scrapes(run: str) -> list[tuple[float, str]]:
    with gzip.open(SOURCE / run / "metrics.jsonl.gz", "rt", encoding="utf-8") as rows:
        recorded = [json.loads(row) for row in rows]
    return [(parse_docker_ts(r["t"]) / 1e9, r["text"]) for r in recorded
            if r["phase"] not in ("starting", "stopping")]


def _points(run: str) -> list[MetricPoint]:
    deriver = Deriver()
    return [deriver.derive(t, parse_metrics(text)) for t, text in _scrapes(run)]


def _bench(run: str) -> list[dict[str, Any]]:
    return json.loads((SOURCE / run / "bench.json").read_text())


def _drafter(run: str) -> str:
    argv = json.loads((SOURCE / run / "run.json").read_text())["argv"]
    return argv[argv.index("--speculative-draft-model-path") + 1]


@pytest.mark.parametrize("run", SPECULATIVE)
def test_the_accept_length_chart_over_the_bench_is_the_recordings_within_5_percent(
        run: str) -> None:
    bench = _bench(run)
    start = parse_docker_ts(bench[0]["start"]) / 1e9
    end = parse_docker_ts(bench[-1]["end"]) / 1e9
    points = _points(run)
    tokens = steps = 0.0
    for before, point in zip(points, points[1:], strict=False):
        if point.t <= start or before.t >= end or not point.accept_len or not point.throughput:
            continue
        made = point.throughput * (point.t - before.t)
        tokens, steps = tokens + made, steps + made / point.accept_len
    levels = [lv for entry in bench for lv in entry["json"]["levels"]]
    out = sum(lv["total_output_tokens"] for lv in levels)
    recorded = out / sum(lv["total_output_tokens"] / (lv["accept_len"] or 1.0) for lv in levels)
    assert steps, f"{run}: no chart point with an accept length during the bench"
    assert tokens / steps == pytest.approx(recorded, rel=0.05), (run, tokens / steps, recorded)


def _alerts(run: str, drafter: str) -> list[Any]:
    watch = AlertWatch(AlertRules(drafter=drafter))
    return [a for p in _points(run) for a in watch.point(p) if a.id == "accept-low"]


def test_the_acceptance_alert_fires_on_the_wrong_drafter_naming_it_and_the_fix() -> None:
    drafter = _drafter(WRONG)
    fired = _alerts(WRONG, drafter)
    assert [a.state for a in fired] == ["firing"], fired
    alert = fired[0]
    assert drafter in alert.summary and alert.evidence["drafter"] == drafter
    assert alert.evidence["accept_len"] < LOW_ACCEPT_LEN
    assert "Deploy the drafter trained for this target" in alert.fix
    assert "algorithm NONE" in alert.fix


@pytest.mark.parametrize("run", [r for r in SPECULATIVE if r != WRONG
                                 and r.startswith("trained_")] or ["trained_dflash"])
def test_a_trained_drafter_raises_no_acceptance_alert(run: str) -> None:
    if not (SOURCE / run / "metrics.jsonl.gz").is_file():
        pytest.skip(f"{run} is not recorded here")
    assert _alerts(run, _drafter(run)) == []


def test_no_speculation_never_raises_it() -> None:
    run = "trained_base" if TRAINED else "base_triton"
    assert _alerts(run, "") == []


def test_the_threshold_sits_between_every_untrained_and_trained_drafter_recorded() -> None:
    accept: dict[str, float] = {}
    for folder in sorted(SOURCE.iterdir()):
        bench = folder / "bench.json"
        if not bench.is_file():
            continue
        levels = [lv for e in json.loads(bench.read_text()) for lv in e["json"]["levels"]]
        values = [lv["accept_len"] for lv in levels if lv.get("accept_len")]
        if values:
            accept[folder.name] = max(values) if not folder.name.startswith("trained_") or \
                folder.name == "trained_wrong" else min(values)
    untrained = {r: a for r, a in accept.items()
                 if not r.startswith("trained_") or r == "trained_wrong"}
    trained = {r: a for r, a in accept.items() if r not in untrained}
    assert untrained and max(untrained.values()) < LOW_ACCEPT_LEN
    if trained:
        assert min(trained.values()) > LOW_ACCEPT_LEN
