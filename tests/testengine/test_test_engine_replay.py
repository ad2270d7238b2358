"""The test engine's replay mode plays the real engine's recordings (real Docker): the
recorded lines on their compressed clock, /health only after the ready line, the recorded
/metrics sequence, /server_info and the raw SSE bytes (docker/test-engine/README.md)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import requests
from docker.models.containers import Container

from tests.conftest_docker import (  # noqa: F401 (fixtures)
    ddtree_argv,
    docker_client,
    health_code,
    host_port,
    run_test_engine,
    test_engine_image,
    wait_for,
)

pytestmark = pytest.mark.docker

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine"
DDTREE = "433c58ed7/ddtree_triton"


def recorded_lines(run: str) -> list[str]:
    with open(RECORDINGS / run / "engine.log", encoding="utf-8", newline="\n") as log:
        return [row.rstrip("\n")[31:] for row in log if row.strip()]


def recorded_metrics(run: str) -> list[str]:
    with gzip.open(RECORDINGS / run / "metrics.jsonl.gz", "rt", encoding="utf-8") as rows:
        # The recorder's "stopping" scrapes are of an engine it was killing: not replayed.
        return [s["text"] for s in map(json.loads, rows)
                if s["status"] == 200 and s["phase"] != "stopping"]


def replay(run_test_engine, run: str, speed: str = "10", max_gap: str = "1") -> Container:  # type: ignore[no-untyped-def]  # noqa: F811
    return run_test_engine(env={"TEST_ENGINE_REPLAY": run, "TEST_ENGINE_REPLAY_SPEED": speed,
                                "TEST_ENGINE_REPLAY_MAX_GAP_S": max_gap})


def output_lines(container: Container, stream: str = "stdout") -> list[str]:
    raw = container.logs(stdout=stream == "stdout", stderr=stream == "stderr").decode()
    return raw.split("\n")[:-1] if raw else []  # blank lines are lines too


def test_a_failed_run_replays_its_lines_on_stdout_and_exits_with_its_recorded_status(  # type: ignore[no-untyped-def]
        run_test_engine):  # noqa: F811
    started = time.monotonic()
    container = replay(run_test_engine, "433c58ed7/missing_model", speed="100")
    assert int(container.wait(timeout=60)["StatusCode"]) == 1  # run.json: exited_by_itself 1
    took = time.monotonic() - started
    printed = output_lines(container)
    assert printed[0].startswith("test engine (a simulator, not SGLang): replaying the "
                                 "recording 433c58ed7/missing_model at 100x")
    assert printed[1:] == recorded_lines("433c58ed7/missing_model")  # no stamp, nothing else
    assert output_lines(container, "stderr") == []
    assert took < 20, f"24 s recorded at 100x took {took:.1f} s"


def test_the_ddtree_replay_is_healthy_only_after_its_ready_line_and_serves_what_was_served(  # type: ignore[no-untyped-def]
        run_test_engine):  # noqa: F811
    container = replay(run_test_engine, DDTREE)
    url = f"http://127.0.0.1:{host_port(container)}"
    codes: list[tuple[int, bool]] = []

    def ready() -> bool:
        code = health_code(url)
        codes.append((code, any("ready to roll" in line for line in output_lines(container))))
        return code == 200

    wait_for(ready, 60, every_s=0.2)
    assert all(printed for code, printed in codes if code == 200)
    assert any(code == 503 for code, _ in codes), "healthy before the start-up was replayed"
    lines = output_lines(container)
    recorded = recorded_lines(DDTREE)
    assert lines[1:] == recorded[:len(lines) - 1]
    assert any(line.startswith("\r  0%|") and "\rCapturing batches (bs=48 " in line
               for line in lines), "tqdm's redraws stay inside one line"
    assert requests.get(f"{url}/metrics", timeout=5).text in recorded_metrics(DDTREE)
    info = json.loads((RECORDINGS / DDTREE / "server_info.json").read_text())
    assert requests.get(f"{url}/server_info", timeout=5).json() == info
    assert requests.get(f"{url}/get_server_info", timeout=5).json() == info
    assert requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"] == \
        "/root/stash/models/tiny-kimi"


def test_the_ddtree_replay_streams_the_recorded_sse_bytes_and_the_recorded_refusal(  # type: ignore[no-untyped-def]
        run_test_engine):  # noqa: F811
    container = replay(run_test_engine, DDTREE)
    url = f"http://127.0.0.1:{host_port(container)}"
    wait_for(lambda: health_code(url) == 200, 60, every_s=0.2)
    rows = (RECORDINGS / DDTREE / "sse_chat.txt").read_text().splitlines()[1:]
    recorded = "".join(json.loads(row)["data"] for row in rows).encode()
    with requests.post(f"{url}/v1/chat/completions", stream=True, timeout=30, json={
            "model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert r.raw.read() == recorded
    probe = json.loads((RECORDINGS / DDTREE / "probe.json").read_text())[0]
    refused = requests.post(f"{url}/generate", timeout=10, json={
        "text": probe["prompt"], "return_logprob": True, "sampling_params": {}})
    assert (refused.status_code, refused.text) == (400, probe["response"])
    hello = requests.post(f"{url}/generate", timeout=10,
                          json={"text": "Hello", "sampling_params": {"max_new_tokens": 1}})
    assert hello.status_code == 200 and hello.json()["text"]


def test_after_its_last_line_the_replay_keeps_the_last_snapshot_and_sigterm_prints_the_stop(  # type: ignore[no-untyped-def]
        run_test_engine):  # noqa: F811
    run = "433c58ed7/ddtree_triton_bs16"  # capture only: ready, idle, stopped; 67 s recorded
    container = replay(run_test_engine, run, speed="40", max_gap="0.5")
    url = f"http://127.0.0.1:{host_port(container)}"
    lines = recorded_lines(run)
    stop = next(i for i, line in enumerate(lines) if "SIGTERM received" in line)
    wait_for(lambda: len(output_lines(container)) == 1 + stop, 60, every_s=0.2)
    time.sleep(1.0)
    assert health_code(url) == 200
    assert requests.get(f"{url}/metrics", timeout=5).text == recorded_metrics(run)[-1]
    container.stop(timeout=10)
    assert int(container.wait(timeout=10)["StatusCode"]) == 0
    assert output_lines(container)[1:] == lines  # the recorded stop, printed on SIGTERM
