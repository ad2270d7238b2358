"""Joined hosts made through the product's own join, for the fleet's tests."""

from __future__ import annotations

from typing import Any

from web.fleet import services

NVML_GPUS = [{"index": i, "name": "NVIDIA H200", "memory_total_gb": 140.4, "uuid": f"GPU-{i}"}
             for i in range(8)]
DOCKER = {"server_version": "26.1.5", "runtimes": ["nvidia", "runc"], "nvidia": True,
          "cdi_devices": []}


def report(**changes: Any) -> dict[str, Any]:
    """An agent's report as it sends it (the join's and the heartbeat's body)."""
    return {"agent_version": "0.9.0", "gpus": NVML_GPUS, "docker": DOCKER,
            "secret_names": ["HF_TOKEN"], **changes}


def joined(name: str = "gpu-2", **changes: Any) -> services.Joined:
    """A host that joined with a token made for it: (its row, its credential)."""
    made = services.jointoken_create(host_name=name)
    return services.host_join(token=made.secret, name=name,
                              facts=services.host_facts_from(report(**changes)))
