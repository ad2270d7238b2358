"""The test engine's `python3 -m sglang.launch_server`: NOT SGLang, a test stand-in.

Used only by the appliance's test suite. It accepts SGLang's real launch flags,
prints SGLang's real log lines in SGLang's order and on SGLang's streams (logging
and tqdm on stderr, uvicorn access lines on stdout), and serves SGLang's HTTP
endpoints. Formats are copied from the SGLang 0.5.23 wheel ("new") and from the
pre-0.5.12 generation ("old"); see docker/test-engine/README.md for the knobs.

This module keeps the entry point; the engine itself is in sglang/test_engine/, one
module per theme (see its __init__.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from sglang.test_engine import batching, engine
from sglang.test_engine.config import make_config, parse_args
from sglang.test_engine.httpserver import EngineHTTPServer
from sglang.test_engine.logits import DivergeError, parse_diverge
from sglang.test_engine.output import emit, log
from sglang.test_engine.phases import start_up
from sglang.test_engine.profile import ProfileError, launch_profiles
from sglang.test_engine.refusals import BuildError, for_build
from sglang.test_engine.replay import Replay, load, resolve
from sglang.test_engine.replay_server import ReplayServer
from sglang.test_engine.server import Handler
from sglang.test_engine.settings import (
    BUILD,
    COLLAPSE_RECORDING,
    DIVERGE,
    FAIL,
    RECORDING,
    RECORDING_SET,
    REPLAY,
    REPLAY_MAX_GAP_S,
    REPLAY_SPEED,
)
from sglang.test_engine.tracebacks import model_missing_exit


def on_sigterm(signum: int, frame: Any) -> None:
    """PID 1 in a container ignores SIGTERM unless handled: exit promptly, with the line every
    recorded stop of the real engine begins with (433c58ed7's http_server; the fixtures)."""
    log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
        pace=False)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    engine.CFG = make_config(parse_args(sys.argv[1:] if argv is None else argv))
    # The batch limit holds only when the launch names it (batching.py says why).
    batching.configure(max_running=engine.CFG.args.max_running_requests or 0,
                       radix_cache=not engine.CFG.args.disable_radix_cache)
    if REPLAY:
        replay_main()
    try:
        engine.PLANTED = parse_diverge(DIVERGE)
    except DivergeError as exc:  # a test's own mistake: said at once, before anything runs
        emit(sys.stderr, f"test engine: {exc}\n")
        sys.exit(2)
    cfg = engine.CFG
    try:  # the recordings its acceptance and step costs play (profile.py)
        engine.PROFILES, engine.COLLAPSED = launch_profiles(
            cfg.algo, cfg.budget if cfg.algo == "DDTREE" else cfg.block, recording=RECORDING,
            set_name=RECORDING_SET, collapse_recording=COLLAPSE_RECORDING)
        engine.REFUSALS = for_build(BUILD, cfg.algo)  # what its build refuses (refusals.py)
    except (ProfileError, BuildError) as exc:
        emit(sys.stderr, f"test engine: {exc}\n")
        sys.exit(2)
    # Where a user meets it (the deployment's log), the simulator says whose figures it plays
    # and whose refusals.
    emit(sys.stdout, f"test engine (a simulator, not SGLang): {engine.PROFILES.says()}; "
                     f"{engine.REFUSALS.says()}\n")
    if FAIL == "model-missing":
        model_missing_exit(engine.CFG)  # before the HTTP server: nothing ever listens
    server = EngineHTTPServer((engine.CFG.args.host, engine.CFG.args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start_up(engine.CFG)
    while True:
        time.sleep(3600)


def replay_main() -> None:
    """TEST_ENGINE_REPLAY: play a recording of the real engine (sglang/test_engine/replay.py);
    of the launch flags only --host and --port count."""
    replay = Replay(load(resolve(REPLAY)), REPLAY_SPEED, REPLAY_MAX_GAP_S)

    def on_stop(signum: int, frame: Any) -> None:
        replay.shut_down()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    # Where a user meets it (the deployment's log), the replay says what it is.
    emit(sys.stdout, f"test engine (a simulator, not SGLang): replaying the recording {REPLAY} "
                     f"at {REPLAY_SPEED:g}x, gaps capped at {REPLAY_MAX_GAP_S:g} s (0: none)\n")
    server = ReplayServer((engine.CFG.args.host, engine.CFG.args.port), replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    replay.run()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
