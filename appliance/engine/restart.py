"""A deployment's restart policy: whether the engine agent starts an engine again after it
died while serving, how often, and after how long.

Opt-in (`restart: {policy: on-failure, max_restarts: 5}`). Only an engine that was ready and
then died is restarted: a failure before ready (a bad flag, an OOM while capturing) comes back
the same way and needs a fix, not a retry. The wait doubles from 10 s up to 5 minutes, as
GPUStack's does; the count starts again at each deploy or Restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.engine.errors import FieldError

POLICIES = ("never", "on-failure")
MAX_RESTARTS_LIMIT = 100
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 300.0
_KEYS = ("policy", "max_restarts")


@dataclass
class RestartPolicy:
    policy: str = "never"
    max_restarts: int = 5

    @property
    def on_failure(self) -> bool:
        return self.policy == "on-failure"


def restart_from(data: Any) -> tuple[RestartPolicy, list[FieldError]]:
    """The spec's `restart:` mapping, or the field errors naming what to write instead."""
    if data is None:
        return RestartPolicy(), []
    if not isinstance(data, Mapping):
        return RestartPolicy(), [FieldError(
            "restart", "must be a mapping", "write restart: {policy: on-failure, max_restarts: 5}")]
    errors = [FieldError(f"restart.{key}"[:80], f"unknown key {str(key)[:40]!r}",
                         f"remove it; valid keys: {', '.join(_KEYS)}")
              for key in data if key not in _KEYS]
    policy = data.get("policy", "never")
    if policy not in POLICIES:
        shown = repr(policy) if len(repr(policy)) <= 40 else "a long value"
        errors.append(FieldError("restart.policy", f"must be one of {', '.join(POLICIES)}, "
                                 f"got {shown}", "write restart: {policy: on-failure}"))
    count = data.get("max_restarts", RestartPolicy.max_restarts)
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 0 <= count <= MAX_RESTARTS_LIMIT:
        shown = repr(count) if len(repr(count)) <= 40 else "a long value"
        errors.append(FieldError("restart.max_restarts",
                                 f"must be an integer from 0 to {MAX_RESTARTS_LIMIT}, got {shown}",
                                 "write restart: {policy: on-failure, max_restarts: 5}"))
    if errors:
        return RestartPolicy(), errors
    return RestartPolicy(policy=str(policy), max_restarts=int(count)), []


def backoff_s(restarts_done: int, *, first_s: float = BACKOFF_FIRST_S,
              max_s: float = BACKOFF_MAX_S) -> float:
    """How long to wait before restart number restarts_done + 1: first_s, doubling, capped."""
    return float(min(max_s, first_s * 2 ** min(restarts_done, 30)))
