"""A recorded bench of the real engine, replayed through the benchmark page: the trained
pair's DFLASH run against its baseline (tests/fixtures/real-engine/433c58ed7/trained_dflash
and trained_base, bench.json, concurrency 1/4/16/32) is what the panel's benchmark task
gets from the sweep, and from there on everything is the panel's own: the task's body
(web.benchmarks.services.benchmark_run) records it and its speedups in PostgreSQL, uvicorn
serves the page and its API, and Chromium draws the charts. What the throughput chart
draws (uPlot's own data), the per-level table's "out tok/s" and the speedup table's ratio
must be the recording's output tok/s (total output tokens over the level's time, from the
first request sent to the last answer's end) within 1 %."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from appliance.bench.metrics import LevelMetrics
from appliance.bench.runner import RunResult, StepResult
from tests.e2e.stack import login
from tests.real_engine import folder
from tests.servers import panel_server
from tests.specs import spec
from web.benchmarks import services
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
RUNS = {"fast": "trained_dflash", "slow": "trained_base"}  # 433c58ed7's


def _recorded(run: str) -> dict[int, dict[str, Any]]:
    bench = json.loads((folder(run) / "bench.json").read_text())
    return {lv["concurrency"]: lv for entry in bench for lv in entry["json"]["levels"]}


def _deployment(name: str, algorithm: str) -> Deployment:
    data = spec(name=name, engine__speculative_algorithm=algorithm)
    return Deployment.objects.create(name=name, spec=data, recipe=data["recipe"],
                                     algorithm=algorithm, gpus=data["gpus"],
                                     status=DeploymentStatus.READY,
                                     engine_url=f"http://{name}.invalid:30000")


@pytest.fixture
def replayed(operator: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, str]]:
    """A benchmark run of two deployments whose sweep answers with the recordings' levels
    (each deployment's name picks its run), recorded by the task's own body."""
    rows = {"fast": _deployment("fast", "DFLASH"), "slow": _deployment("slow", "NONE")}
    names = {key: services.target_name(row) for key, row in rows.items()}
    levels = sorted(_recorded(RUNS["fast"]))

    def sweep(targets: Any, prompts: Any, options: Any, progress: Any, cancel: Any
              ) -> RunResult:
        by_name = {name: RUNS[key] for key, name in names.items()}
        return RunResult([StepResult(t.name, LevelMetrics.from_dict(
            {k: v for k, v in _recorded(by_name[t.name])[level].items() if k != "target"}))
            for t in targets for level in options.levels])

    monkeypatch.setattr(services.tasks, "benchmark_run_later", lambda run_id: None)
    monkeypatch.setattr(services, "run_benchmark", sweep)
    run = services.benchmark_create(
        deployment_ids=[rows["fast"].pk, rows["slow"].pk], baseline_id=rows["slow"].pk,
        user=operator, config={"levels": levels, "num_prompts": 8, "input_len": 256,
                               "output_len": 128, "prompt_source": "synthetic",
                               "mode": "back_to_back", "warmup": 1, "seed": 0})
    assert services.benchmark_run(run_id=run.pk) == "done"
    return run.pk, names


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with panel_server(tmp_path / "web.log") as url:
        yield url


def test_the_throughput_chart_and_tables_are_the_recorded_output_tok_s_within_1_percent(
        replayed: tuple[int, dict[str, str]], server: str, page: Page) -> None:
    pk, names = replayed
    recorded = {names[key]: _recorded(run) for key, run in RUNS.items()}
    login(page, server)
    page.goto(f"{server}/benchmarks/{pk}/")
    expect(page.locator("#bench-status")).to_have_text("done")
    expect(page.locator("#levels-table tbody tr")).to_have_count(8)
    chart = page.evaluate("ApplianceBench.stats()")["chart-throughput"]
    assert chart["xs"] == [1, 4, 16, 32] and sorted(chart["series"]) == sorted(recorded)
    for name, values in zip(chart["series"], chart["values"], strict=True):
        want = [recorded[name][c]["output_throughput"] for c in chart["xs"]]
        assert values == pytest.approx(want, rel=0.01), name
    # The per-level table: deployment, concurrency, ..., out tok/s (one decimal).
    for row in page.locator("#levels-table tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        want = recorded[cells[0]][int(cells[1])]["output_throughput"]
        assert float(cells[5]) == pytest.approx(want, rel=0.01), cells
    # The speedup table: the DFLASH run's tok/s over the baseline's, as the recordings give.
    speedups = page.locator("#speedup-table tbody tr").all()
    assert len(speedups) == 4
    for row in speedups:
        cells = row.locator("td").all_inner_texts()
        level = int(cells[1])
        want = (recorded[names["fast"]][level]["output_throughput"]
                / recorded[names["slow"]][level]["output_throughput"])
        assert float(cells[2].rstrip("x")) == pytest.approx(want, rel=0.01), cells
