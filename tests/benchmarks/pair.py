"""What the check's tests share: a DDTREE test engine deployment with planted divergences
and a baseline of the same model without speculation, and a wait for the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from appliance.bench.verify import shipped_prompts
from tests.specs import spec

FIB, FOX = shipped_prompts()[2], shipped_prompts()[0]  # "def fibonacci(n):", "The quick brown fox"
# A failure at token 5 of the first, a near-tie at token 12 of the second (the simulated
# model's near-ties: p % 8 == 4), every other prompt identical.
PLANTED = "margin:5@def fibonacci,near-tie:12@quick brown"
STACK_ENV = {"APPLIANCE_ENGINE_GPU_REQUESTS": "0",
             "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.01,TEST_ENGINE_SHARDS=4",
             "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5"}


def speculative_spec() -> dict[str, Any]:
    return spec(name="spec", env={"TEST_ENGINE_DIVERGE": PLANTED}, self_check=False, gpus=[0])


def baseline_spec() -> dict[str, Any]:
    data = spec(name="base", recipe="kimi-k2.6-baseline", self_check=False, gpus=[1])
    data["engine"] = {"model_path": "/models/Kimi-K2.6", "tp_size": 1, "trust_remote_code": True}
    return data


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not {what} within {timeout_s} s")
