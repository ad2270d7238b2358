"""What a GPU host's Docker engine can do: its runtimes, CDI devices, whether NVIDIA's runtime
is there. Framework-free: every host's agent sends it with its join and its heartbeats."""

from __future__ import annotations

import time
from typing import Any

from appliance.simulator import simulator_tags

_FACTS_TTL_S = 30.0
_facts_cache: dict[str, Any] = {}


def docker_facts(runtime: Any) -> dict[str, Any]:
    """Docker's runtimes and CDI devices, whether the NVIDIA runtime is there, and its images
    that are the simulator (cached)."""
    cached = _facts_cache.get("facts")
    if cached is not None and time.monotonic() - cached[0] < _FACTS_TTL_S:
        return dict(cached[1])
    info = runtime.client.info()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = [d.get("ID") for d in info.get("DiscoveredDevices") or [] if d.get("Source") == "cdi"]
    facts = {"runtimes": runtimes, "cdi_devices": cdi,
             "nvidia": "nvidia" in runtimes or any("nvidia.com/gpu" in str(d) for d in cdi),
             "server_version": info.get("ServerVersion"), "name": info.get("Name"),
             # The panel labels every deployment and result of one of these as simulated.
             "simulator_images": simulator_tags(runtime.client)}
    _facts_cache["facts"] = (time.monotonic(), facts)
    return facts
