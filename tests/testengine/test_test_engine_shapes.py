"""The test engine's synthetic lines have the shapes of the real engine's (real Docker).

Every kind of line the synthetic engine prints in its "new" style (SGLang 433c58ed7, the
pinned source) is held against the recordings of that source (tests/fixtures/real-engine/
433c58ed7/*/engine.log): with the time, the numbers, the lists and tqdm's bar abstracted,
each synthetic line must have a real line of the same shape, so the two cannot drift. A
failure shows both lines. The recordings win: where they differed, the synthetic engine
was changed (docker/test-engine/README.md says how).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from docker.client import DockerClient

from tests.conftest_docker import (  # noqa: F401 (fixtures)
    FAST_ENV,
    TEST_LABEL,
    ddtree_argv,
    docker_client,
    health_code,
    host_port,
    test_engine_image,
    wait_for,
)

pytestmark = pytest.mark.docker

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine" / "433c58ed7"
_TIME = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LIST = re.compile(r"\[N(?:, N)*\]")
_BAR = re.compile(r"%\|[^|]*\|")
_REQUEST = re.compile(r'"(GET|POST) \S+ HTTP/N" N [A-Za-z ]+$')
_RATE = re.compile(r"N(?:s/it|it/s)")  # tqdm's unit follows the rate: one format
_FIELD = re.compile(r"(?:\(|, )([a-z_0-9]+)=")


def shape(line: str) -> str:
    """The line with what varies from run to run abstracted: time, numbers, lists, bars."""
    text = _TIME.sub("[T", line.strip())
    text = _LIST.sub("[N...]", _NUMBER.sub("N", text))
    text = _BAR.sub("%|BAR|", text)
    text = _RATE.sub("RATE", _REQUEST.sub('"METHOD PATH HTTP/N" N PHRASE', text))
    return re.sub(r"\s+", " ", text)


def message(line: str) -> str:
    return line.split("] ", 1)[1] if _TIME.match(line) else line


def segments(lines: list[str]) -> list[str]:
    """tqdm's redraws: each '\\r' piece of a line is one state of the bar."""
    return [piece for line in lines if "\r" in line for piece in line.split("\r") if piece]


# kind -> which lines (messages) are of that kind; progress kinds are '\r' segments.
KINDS: dict[str, Callable[[str], bool]] = {
    "weights_begin": lambda m: m.startswith("Load weight begin."),
    "weights_end": lambda m: m.startswith("Load weight end."),
    "kv_cache_target": lambda m: m.startswith("KV Cache is allocated.") and "KV size" in m,
    "kv_cache_draft": lambda m: m.startswith("KV Cache is allocated.") and "K size" in m,
    "memory_pool_end": lambda m: m.startswith("Memory pool end."),
    "capture_begin": lambda m: bool(re.match(r"Capture \w+ \w+ CUDA graph begin\.", m)),
    "capture_end": lambda m: bool(re.match(r"Capture \w+ \w+ CUDA graph end\.", m)),
    "prefill_batch": lambda m: m.startswith("Prefill batch,"),
    "decode_batch": lambda m: m.startswith("Decode batch,"),
    "max_total_num_tokens": lambda m: m.startswith("max_total_num_tokens="),
    "ready": lambda m: m.startswith("The server is fired up"),
    "uvicorn_started": lambda m: m.startswith("INFO:     Started server process"),
    "uvicorn_waiting": lambda m: m.startswith("INFO:     Waiting for application startup"),
    "uvicorn_complete": lambda m: m.startswith("INFO:     Application startup complete"),
    "uvicorn_running": lambda m: m.startswith("INFO:     Uvicorn running on"),
    "access": lambda m: bool(re.match(r'INFO:     \S+ - "(GET|POST) ', m)),
    "sigterm": lambda m: m.startswith("SIGTERM received"),
}
PROGRESS: dict[str, Callable[[str], bool]] = {
    "capture_progress": lambda s: s.startswith(("Capturing batches", "  0%|")),
    "weights_progress": lambda s: s.startswith("Multi-thread loading shards"),
}


def real_lines() -> list[str]:
    out: list[str] = []
    for log in sorted(RECORDINGS.glob("*/engine.log")):
        with open(log, encoding="utf-8", newline="\n") as rows:
            out += [row.rstrip("\n")[31:] for row in rows]
    return out


def synthetic_run(client: DockerClient, image: str, argv: list[str]) -> list[str]:
    """One synthetic start-up and a few requests: every line it printed, both streams."""
    container = client.containers.run(image, command=argv, detach=True, environment=FAST_ENV,
                                      labels={TEST_LABEL: "1"},
                                      ports={"30000/tcp": ("127.0.0.1", None)})
    try:
        url = f"http://127.0.0.1:{host_port(container)}"
        wait_for(lambda: health_code(url) == 200, 30)
        requests.post(f"{url}/generate", timeout=10,
                      json={"text": "hello there", "sampling_params": {"max_new_tokens": 24}})
        requests.get(f"{url}/metrics", timeout=5)
        wait_for(lambda: b"Decode batch" in container.logs(), 10)
        container.stop(timeout=10)  # SIGTERM: the stop's own lines too
        return container.logs().decode().split("\n")
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def synthetic(docker_client: DockerClient, test_engine_image: str) -> Iterator[list[str]]:  # noqa: F811
    """The recorded runs' settings at TP1: DDTREE (budget 32, block 8) and no speculation."""
    interval = ["--decode-log-interval", "2"]
    ddtree = ddtree_argv(tp=1) + interval
    plain = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.6",
             "--tp-size", "1", "--host", "0.0.0.0", "--port", "30000", "--enable-metrics",
             *interval]
    yield (synthetic_run(docker_client, test_engine_image, ddtree)
           + synthetic_run(docker_client, test_engine_image, plain))


@pytest.fixture(scope="module")
def real() -> list[str]:
    return real_lines()


def check_shapes(kind: str, synthetic_lines: list[str], recorded: list[str]) -> None:
    assert synthetic_lines, f"the synthetic engine printed no {kind} line"
    assert recorded, f"the recordings hold no {kind} line"
    shapes = {shape(r): r for r in recorded}
    for line in synthetic_lines:
        if shape(line) in shapes:
            continue
        near = difflib.get_close_matches(shape(line), list(shapes), n=1, cutoff=0) or [""]
        pytest.fail(f"{kind}: no recorded line has the shape of the synthetic one\n"
                    f"  synthetic: {line!r}\n  its shape: {shape(line)!r}\n"
                    f"  nearest recorded: {shapes.get(near[0], '')!r}\n"
                    f"  its shape:        {near[0]!r}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_of_synthetic_line_has_a_recorded_line_of_the_same_shape(
        kind: str, synthetic: list[str], real: list[str]) -> None:
    keep = KINDS[kind]
    check_shapes(kind, [line for line in synthetic if "\r" not in line and keep(message(line))],
                 [line for line in real if "\r" not in line and keep(message(line))])


@pytest.mark.parametrize("kind", sorted(PROGRESS))
def test_each_state_of_a_synthetic_progress_bar_has_a_recorded_one_of_the_same_shape(
        kind: str, synthetic: list[str], real: list[str]) -> None:
    keep = PROGRESS[kind]
    check_shapes(kind, [s for s in segments(synthetic) if keep(s)],
                 [s for s in segments(real) if keep(s)])


def test_synthetic_server_args_name_real_fields_in_the_real_order(
        synthetic: list[str], real: list[str]) -> None:
    def fields(lines: list[str]) -> list[list[str]]:
        return [_FIELD.findall(message(line)) for line in lines
                if message(line).startswith("server_args=ServerArgs(")]

    recorded = fields(real)[0]
    printed = fields(synthetic)
    assert printed, "the synthetic engine printed no server_args line"
    for names in printed:
        unknown = [n for n in names if n not in recorded]
        assert not unknown, f"ServerArgs of 433c58ed7 has no field {unknown}"
        order = [recorded.index(n) for n in names]
        assert order == sorted(order), (
            f"synthetic order {names} is not the recorded order "
            f"{sorted(names, key=recorded.index)}")


def test_shapes_abstract_what_varies_and_keep_what_does_not() -> None:
    # The check itself can fail: a field out of place or renamed changes the shape.
    real = "[2026-12-01 09:26:00] Load weight end. elapsed=0.26 s, type=X, avail mem=139.00 GB."
    assert shape(real) == shape("[2026-01-02 10:00:01] Load weight end. elapsed=12.5 s, "
                                "type=X, avail mem=7.00 GB.")
    assert shape(real) != shape("[2026-01-02 10:00:01 TP0] Load weight end. elapsed=1.00 s, "
                                "type=X, avail mem=7.00 GB.")
    assert shape(real) != shape("[2026-01-02 10:00:01] Load weight end. type=X, elapsed=1.00 s, "
                                "avail mem=7.00 GB.")
