"""EngineFollower against the real Docker engine: every line once, in order, with its cursor,
and the sink asked anything else only after the lines before it are stored."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
from docker.client import DockerClient

from appliance.logs.causes import Diagnosis
from appliance.runtime.container_plan import LABEL_DEPLOYMENT, ContainerPlan
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.cursor import Cursor
from appliance.runtime.follow_threads import FollowOptions
from appliance.runtime.follower import EngineFollower, follow
from tests.conftest_docker import (  # noqa: F401 (fixtures)
    BASE_IMAGE,
    TEST_LABELS,
    docker_client,
    unique_id,
)

# Every test here removes the follower-test containers it finds: one worker runs them all.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("follower")]

DECODE = ("[2026-12-01 09:27:25 TP0] Decode batch, #running-req: 1, #token: {i}, token usage: "
          "0.00, accept len: 3.20, accept rate: 0.40, cuda graph: True, gen throughput "
          "(token/s): 165.82, #queue-req: 0")


class RecordingSink:
    """Keeps what the follower gives it, as the agent's database sink would store it."""

    def __init__(self, fail_on_ship: int = 0) -> None:
        self.shipped: list[tuple[str, dict[str, Any]]] = []
        self.cursors: list[Cursor] = []
        self.asked: list[tuple[str, int]] = []  # (call, events stored when it came)
        self.fail_on_ship = fail_on_ship
        self.ships = 0
        self.batch_starts: list[int] = []
        self.idles = 0

    def ship(self, events: list[tuple[str, dict[str, Any]]], cursor: Cursor | None) -> None:
        self.ships += 1
        if self.ships == self.fail_on_ship:
            raise LookupError("the lease is gone")
        self.batch_starts.append(len(self.shipped))
        self.shipped.extend(events)
        if cursor is not None:
            self.cursors.append(cursor)

    def advance(self, status: str) -> bool:
        self.asked.append((f"advance:{status}", len(self.shipped)))
        return True

    def ready(self, engine_url: str) -> bool:
        self.asked.append(("ready", len(self.shipped)))
        return True

    def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None:
        self.asked.append((f"failed:{diagnosis.cause}", len(self.shipped)))

    def keep_following(self) -> bool:
        return True

    def idle(self) -> None:
        self.idles += 1

    def texts(self) -> list[str]:
        return [p["text"] for kind, p in self.shipped if kind == "log"]


@pytest.fixture
def runtime(docker_client: DockerClient) -> Iterator[EngineRuntime]:  # noqa: F811
    yield EngineRuntime(docker_client)
    _remove_test_containers(docker_client)


def _remove_test_containers(docker_client: DockerClient) -> None:  # noqa: F811
    for container in docker_client.containers.list(ignore_removed=True,
            all=True, filters={"label": f"{LABEL_DEPLOYMENT}"}):
        if (container.labels or {}).get("appliance.instance") == "follower-test":
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def _run(runtime: EngineRuntime, script: str, sink: RecordingSink,
         status: str = "ready") -> str:
    plan = ContainerPlan(deployment_id=unique_id("fol"), image=BASE_IMAGE,
                         argv=["python3", "-c", script], labels=dict(TEST_LABELS),
                         instance_id="follower-test", start_token="t1")
    runtime.ensure_started(plan)
    follower = EngineFollower(runtime, plan, sink, status=status, may_start=False,
                              options=FollowOptions(partials=False, health_poll_s=3600))
    return follow(follower)


def test_every_line_of_a_burst_is_shipped_once_in_order_with_the_last_lines_cursor(runtime):  # type: ignore[no-untyped-def]
    n = 30_000
    script = ("import sys\n"
              f"sys.stdout.write(''.join({DECODE!r}.format(i=i) + '\\n' for i in range({n})))\n")
    sink = RecordingSink()
    assert _run(runtime, script, sink) == "failed"  # it exited: the follower says so
    assert sink.texts() == [DECODE.format(i=i) for i in range(n)]
    metrics = [p["tokens"] for kind, p in sink.shipped if kind == "metric"]
    assert metrics == list(range(n))
    assert sink.ships > 2  # in batches, not one by one and not all at once
    assert sink.idles >= 1  # told when it had nothing more to write (its connection can go)
    assert sink.cursors == sorted(sink.cursors, key=lambda c: (c.ts_ns, c.count))
    assert sink.asked == [("failed:engine-exited", len(sink.shipped))]


class ShortFollowRuntime(EngineRuntime):
    """Docker's follow ending short of the lines stored (an engine's last 684 lines on a
    loaded machine, CI 2026-12-07): each follow hands out at most `cut` lines."""

    def __init__(self, client: DockerClient, cut: int) -> None:
        super().__init__(client)
        self.cut = cut
        self.follows = 0

    def follow_logs(self, container: Any, since: float | None = None, partials: bool = False,
                    timestamps: bool = False, follow: bool = True) -> Iterator[Any]:
        lines = super().follow_logs(container, since, partials, timestamps, follow)
        if not follow:
            return lines
        self.follows += 1
        return self._cut(lines)

    def _cut(self, lines: Iterator[Any]) -> Iterator[Any]:
        for n, line in enumerate(lines, start=1):
            yield line
            if n == self.cut:
                break
        lines.close()  # type: ignore[attr-defined]


def test_lines_a_short_follow_left_out_are_read_from_the_stored_log(docker_client):  # type: ignore[no-untyped-def]  # noqa: F811
    n = 12_000
    script = ("import sys, time\n"
              "sys.stdout.write(''.join(f'early {i}\\n' for i in range(6000))); sys.stdout.flush()\n"
              "time.sleep(1.5)\n"
              f"sys.stdout.write(''.join(f'late {{i}}\\n' for i in range({n - 6000})))\n")
    short = ShortFollowRuntime(docker_client, cut=2500)
    sink = RecordingSink()
    try:
        assert _run(short, script, sink) == "failed"  # it exited
    finally:
        _remove_test_containers(docker_client)
    want = [f"early {i}" for i in range(6000)] + [f"late {i}" for i in range(n - 6000)]
    assert sink.texts() == want  # none lost, none twice, in order
    assert sink.asked == [("failed:engine-exited", len(sink.shipped))]


def test_a_phase_is_asked_for_only_after_the_lines_before_it_are_stored(runtime):  # type: ignore[no-untyped-def]
    script = ("import sys, time\n"
              "sys.stdout.write(''.join(f'plain {i}\\n' for i in range(5000))); sys.stdout.flush()\n"
              "time.sleep(1)\n"
              "print('[2026-12-01 09:27:25 TP0] Load weight begin. avail mem=70.00 GB', flush=True)\n"
              "sys.stdout.write(''.join(f'after {i}\\n' for i in range(5000)))\n")
    sink = RecordingSink()
    _run(runtime, script, sink, status="starting")
    # Every earlier batch is stored when the phase is asked for; the batch being parsed,
    # with the line that moved it, is stored after (as before the shipper thread).
    texts = sink.texts()
    assert texts[:5000] == [f"plain {i}" for i in range(5000)]
    assert texts[5000].startswith("[2026-12-01") and texts[-1] == "after 4999"
    its_batch = max(start for start in sink.batch_starts if start <= 5000)
    assert sink.asked[0] == ("advance:loading", its_batch)


def test_a_bars_piece_shows_progress_but_only_lines_move_the_phase(runtime):  # type: ignore[no-untyped-def]
    # The bar's pieces come on the attach stream and the lines on the log stream, with no
    # order between the two: a capture bar's piece seen before the weight lines printed
    # ahead of it (a loaded machine, CI 2026-12-06) moved the phase straight to capturing,
    # and `loading` never came. Here the piece (on stderr, with no end of line until the
    # exit) comes 3 s before the lines (on stdout, in the engine's order).
    bar = "Capturing batches (bs=48 avail_mem=7.49 GB):   4%|4         | 1/23 [00:29<10:51, 29.62s/it]"
    script = ("import sys, time\n"
              "time.sleep(1.5)\n"  # the attach is made after the start: it shows what follows
              f"sys.stderr.write({bar!r}); sys.stderr.flush(); time.sleep(3)\n"
              "print('[2026-12-01 09:26:00] Load weight begin. avail mem=139.13 GB', flush=True)\n"
              "print('[2026-12-01 09:26:02] Capture target verify CUDA graph begin. backend=full, "
              "num_tokens_per_req=33, bs=[1, 2], avail mem=18.31 GB', flush=True)\n"
              "time.sleep(0.5)\n")
    plan = ContainerPlan(deployment_id=unique_id("fol"), image=BASE_IMAGE,
                         argv=["python3", "-c", script], labels=dict(TEST_LABELS),
                         instance_id="follower-test", start_token="t1")
    sink = RecordingSink()
    follower = EngineFollower(runtime, plan, sink, status="starting", may_start=True,
                              options=FollowOptions(partials=True, health_poll_s=3600))
    assert follow(follower) == "failed"  # it exited, never ready
    pieces = [p for kind, p in sink.shipped if kind == "progress" and p.get("partial")]
    assert pieces and pieces[0]["kind"] == "capture_progress", sink.shipped[:5]
    moves = [call for call, _ in sink.asked if call.startswith("advance:")]
    assert moves == ["advance:loading", "advance:capturing"]


def test_the_bars_stream_ends_once_the_engine_is_ready(runtime):  # type: ignore[no-untyped-def]
    # A bar's pieces come on an attach stream read on a thread of its own. Once the engine
    # serves, no bar is drawn, and that stream cost a read of every line it printed for as
    # long as it served (docs/performance.md, "The bar's stream after ready"). It ends at
    # ready; the lines go on.
    import threading
    import time

    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.2s/it]"
    script = ("import sys, time\n"
              "time.sleep(1.5)\n"  # the attach is made after the start
              f"sys.stderr.write({bar!r}); sys.stderr.flush()\n"
              "time.sleep(4)\n"  # ready meanwhile (at 3 s)
              "for i in range(200): print(f'served {i}', flush=True); time.sleep(0.005)\n"
              "time.sleep(1)\n")
    started = time.monotonic()
    readers_alive: list[bool] = []

    class Engine:
        base_url = "http://engine"

        def health(self) -> int:
            return 200 if time.monotonic() - started > 3 else 503

        def generate_one_token(self) -> None:
            return None

    class WatchingSink(RecordingSink):
        def ship(self, events: list[tuple[str, dict[str, Any]]], cursor: Cursor | None) -> None:
            super().ship(events, cursor)
            if any(p.get("text") == "served 199" for kind, p in events if kind == "log"):
                readers_alive.append(any(t.name == "engine-progress-reader" and t.is_alive()
                                         for t in threading.enumerate()))

    plan = ContainerPlan(deployment_id=unique_id("fol"), image=BASE_IMAGE,
                         argv=["python3", "-c", script], labels=dict(TEST_LABELS),
                         instance_id="follower-test", start_token="t1")
    sink = WatchingSink()
    follower = EngineFollower(runtime, plan, sink, status="starting", may_start=True,
                              client_factory=lambda url: Engine(),  # type: ignore[arg-type,return-value]
                              options=FollowOptions(partials=True, health_poll_s=0.2))
    assert follow(follower) == "failed"  # it exited while serving
    pieces = [p for kind, p in sink.shipped if kind == "progress" and p.get("partial")]
    assert pieces, sink.shipped[:5]  # the bar before ready, live
    assert [call for call, _ in sink.asked if call == "ready"] == ["ready"]
    assert [t for t in sink.texts() if t.startswith("served ")] == \
        [f"served {i}" for i in range(200)]
    assert readers_alive == [False]  # the bar's stream had ended while the engine served


def test_a_line_docker_cut_into_pieces_comes_back_whole_without_their_stamps(runtime):  # type: ignore[no-untyped-def]
    # Docker stores a line over 16 KiB as several messages, each with its own timestamp.
    script = ("print(''.join(str(i % 10) for i in range(100_000)), flush=True)\n"
              "print('ünïcödé ✓', flush=True)\n")
    sink = RecordingSink()
    _run(runtime, script, sink)
    assert sink.texts() == ["".join(str(i % 10) for i in range(100_000)), "ünïcödé ✓"]


def test_a_failed_ship_ends_the_follower_with_its_error_and_ships_nothing_after(runtime):  # type: ignore[no-untyped-def]
    script = ("import sys, time\n"
              "for b in range(40):\n"
              "    sys.stdout.write(''.join(f'line {b} {i}\\n' for i in range(500)))\n"
              "    sys.stdout.flush(); time.sleep(0.05)\n")
    sink = RecordingSink(fail_on_ship=3)
    with pytest.raises(LookupError, match="lease is gone"):
        _run(runtime, script, sink)
    assert sink.ships == 3  # the failed one was the last
    assert sink.asked == []  # nor is the engine reported failed by a follower that lost it
    texts = sink.texts()
    assert 0 < len(texts) < 20_000
    assert texts == [f"line {b} {i}" for b in range(40) for i in range(500)][:len(texts)]


SLOW_HEALTH_ENGINE = r"""
import http.server, sys, threading, time
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(4)  # an engine busy loading answers late
        self.send_response(503); self.end_headers()
    def log_message(self, *args): pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", 30000), Slow)
threading.Thread(target=server.serve_forever, daemon=True).start()
for i in range(300):
    print(f"tick {i} t={time.time()}", flush=True)
    time.sleep(0.01)
time.sleep(0.5)
"""


def test_a_slow_health_answer_before_ready_holds_no_line_back(runtime):  # type: ignore[no-untyped-def]
    import time

    shipped_at: dict[str, float] = {}

    class TimedSink(RecordingSink):
        def ship(self, events: list[tuple[str, dict[str, Any]]], cursor: Cursor | None) -> None:
            super().ship(events, cursor)
            now = time.time()
            for kind, payload in events:
                if kind == "log":
                    shipped_at[payload["text"]] = now

    plan = ContainerPlan(deployment_id=unique_id("fol"), image=BASE_IMAGE,
                         argv=["python3", "-c", SLOW_HEALTH_ENGINE], labels=dict(TEST_LABELS),
                         instance_id="follower-test", start_token="t1")
    runtime.ensure_started(plan)
    sink = TimedSink()
    follower = EngineFollower(runtime, plan, sink, status="starting", may_start=False,
                              options=FollowOptions(partials=False, health_poll_s=0.1))
    assert follow(follower) == "failed"  # it exited, never ready
    ticks = {text: float(text.rsplit("t=", 1)[1]) for text in sink.texts()
             if text.startswith("tick ")}
    assert len(ticks) == 300
    # /health took 4 s an answer, over and over, while the lines came: none waited for it.
    assert max(shipped_at[text] - printed for text, printed in ticks.items()) < 1.0


def test_a_nul_in_a_line_comes_back_as_the_replacement_character(runtime):  # type: ignore[no-untyped-def]
    # PostgreSQL's jsonb refuses \u0000: stored as is, the line failed its batch forever.
    script = "import sys\nsys.stdout.write('before\\nnul \\x00 here\\nafter\\n')\n"
    sink = RecordingSink()
    _run(runtime, script, sink)
    assert sink.texts() == ["before", "nul \ufffd here", "after"]


def test_the_failure_of_an_engine_is_diagnosed_with_the_specs_facts(runtime):  # type: ignore[no-untyped-def]
    # TP2 in a container that sees one GPU (tests/fixtures/logs/fewer_gpus_visible.log, as
    # 433c58ed7 prints it), for a spec that lists one GPU: the fix quotes the spec's list.
    from pathlib import Path

    from appliance.logs.stamps import without_docker_stamps

    log = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "fewer_gpus_visible.log"
    text = "".join(without_docker_stamps(log.read_text().splitlines(keepends=True)))
    script = f"import sys\nsys.stdout.write({text!r})\nsys.stdout.flush()\nsys.exit(1)\n"

    class DiagnosedSink(RecordingSink):
        diagnosis: Diagnosis | None = None

        def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None:
            super().failed(diagnosis, message, last_lines)
            self.diagnosis = diagnosis

    plan = ContainerPlan(deployment_id=unique_id("fol"), image=BASE_IMAGE,
                         argv=["python3", "-c", script], labels=dict(TEST_LABELS),
                         instance_id="follower-test", start_token="t1")
    runtime.ensure_started(plan)
    sink = DiagnosedSink()
    follower = EngineFollower(runtime, plan, sink, status="loading", may_start=False,
                              options=FollowOptions(partials=False, health_poll_s=3600),
                              facts={"gpus": [0], "tp_size": 2, "pp_size": 1})
    assert follow(follower) == "failed"
    assert sink.diagnosis is not None and sink.diagnosis.cause == "fewer-gpus-visible"
    assert "GPU ids in the form (spec key gpus), now [0]" in sink.diagnosis.fix
