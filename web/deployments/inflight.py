"""Requests the gateway has relayed to one engine and not yet finished, in every panel process.

One Redis counter per deployment row (a replica is a row): the proxy increments it when it
starts relaying and decrements it when the relay ends, however it ends. A rolling change
reads it to know when a drained replica has finished its requests. The counter expires if
nothing touches it for INFLIGHT_TTL_S, so a process killed mid-request leaves no count behind
for longer than that.
"""

from __future__ import annotations

from typing import Any

INFLIGHT_TTL_S = 900  # longer than any request the gateway relays (its upstream timeout)


def inflight_key(*, deployment_id: int) -> str:
    return f"appliance:gateway:inflight:{deployment_id}"


def replica_inflight(*, client: Any, deployment_id: int) -> int:
    """The requests in flight to this deployment row's engine now (0 when none or unknown)."""
    value = client.get(inflight_key(deployment_id=deployment_id))
    return max(0, int(value)) if value is not None else 0
