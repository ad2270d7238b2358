"""Constants and the TEST_ENGINE_* environment knobs (read once, at import)."""

from __future__ import annotations

import os

SITE = "/usr/local/lib/python3.12/dist-packages"
SRT = f"{SITE}/sglang/srt"
TOTAL_MEM_GB = 139.81
HIST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


PACE_S = env_float("TEST_ENGINE_PACE_S", 0.05)
# Seconds per decode step; 0 (the default): the recorded step time (profile.py).
TOKEN_S = env_float("TEST_ENGINE_TOKEN_S", 0.0)
# Prefill time per uncached prompt token (0: the recorded TTFT instead, profile.py).
PREFILL_TOKEN_S = env_float("TEST_ENGINE_PREFILL_TOKEN_S", 0.0)
# The prefix cache's size in tokens (the KV pool's, as SGLang's radix cache is bounded by it).
CACHE_TOKENS = int(env_float("TEST_ENGINE_CACHE_TOKENS", 1048576))
SHARDS = int(env_float("TEST_ENGINE_SHARDS", 8))
FAIL = os.environ.get("TEST_ENGINE_FAIL", "").strip()
STYLE = os.environ.get("TEST_ENGINE_LOG_STYLE", "new").strip().lower()
# A quantized target's method as `Load weight end` names it (e.g. fp8); empty: unquantized.
QUANT = os.environ.get("TEST_ENGINE_MODEL_QUANT", "").strip()
# Mean accepted tokens per verify step; 0 (the default): the recording's (profile.py).
ACCEPT_LEN = env_float("TEST_ENGINE_ACCEPT_LEN", 0.0)
# The recording a speculative mode plays (profile.py), and the set its runs come from.
RECORDING = os.environ.get("TEST_ENGINE_RECORDING", "").strip()
RECORDING_SET = os.environ.get("TEST_ENGINE_RECORDING_SET", "").strip()
# The engine build whose refusals the simulator imitates (refusals.py): a release or a
# commit's first 9 hex digits, as appliance/engine/refusals.py keys them; empty: 433c58ed7.
BUILD = os.environ.get("TEST_ENGINE_BUILD", "").strip()
# Synthetic requests the engine serves itself once ready (0: only real requests).
TRAFFIC = int(env_float("TEST_ENGINE_TRAFFIC", 0))
# accept-collapse: this long after ready, acceptance falls to COLLAPSED_ACCEPT_LEN, or (0, the
# default) to that of COLLAPSE_RECORDING, a drafter run against a target it was not trained
# for (default: the trained pair's wrong-drafter run where the image has it, else the
# random-weight DFLASH run).
COLLAPSE_AFTER_S = env_float("TEST_ENGINE_COLLAPSE_AFTER_S", 20.0)
COLLAPSED_ACCEPT_LEN = env_float("TEST_ENGINE_COLLAPSED_ACCEPT_LEN", 0.0)
COLLAPSE_RECORDING = os.environ.get("TEST_ENGINE_COLLAPSE_RECORDING", "").strip()
# hang-serve: the tokens made (since the start) before the scheduler hangs.
HANG_AFTER_TOKENS = int(env_float("TEST_ENGINE_HANG_AFTER_TOKENS", 0))
# capture-stall: how long the target's capture stops (then it goes on).
STALL_S = env_float("TEST_ENGINE_STALL_S", 3600.0)
# The block size the drafter's config.json says (0: the same as the one the engine runs):
# another one makes the engine print 433c58ed7's block-size-mismatch warning and run its own.
DRAFTER_BLOCK_SIZE = int(env_float("TEST_ENGINE_DRAFTER_BLOCK_SIZE", 0))
# Replay mode: a recording folder (relative to the image's recordings, or absolute), how
# many times faster than recorded it plays, and the longest any one gap may last (0: no cap).
# Divergences planted in /generate's output (sglang/test_engine/logits.py says the syntax).
DIVERGE = os.environ.get("TEST_ENGINE_DIVERGE", "").strip()
REPLAY = os.environ.get("TEST_ENGINE_REPLAY", "").strip()
REPLAY_SPEED = max(env_float("TEST_ENGINE_REPLAY_SPEED", 1.0), 0.001)
REPLAY_MAX_GAP_S = env_float("TEST_ENGINE_REPLAY_MAX_GAP_S", 0.0)
