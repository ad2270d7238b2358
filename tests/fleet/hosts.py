"""Joined hosts made through the product's own join, and a host's agent run against a live
panel, for the fleet's tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.panel_link import panel_link_open
from appliance.runtime.remote_agent import RemoteAgent, host_report
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


@contextmanager
def remote_agent_running(config: RemoteSettings) -> Iterator[tuple[RemoteAgent, threading.Thread]]:
    """A host's agent as `python3 -m worker.agent` runs it: its link opened (a join with the
    config's token, or its stored credential), ticking on a thread of this process until the
    block ends (then stopped, joined for up to 20 s)."""
    runtime = EngineRuntime()
    link = panel_link_open(panel_url=config.panel_url, credential_path=config.credential_path,
                           token=config.join_token, name=config.host_name,
                           report=host_report(runtime, config))
    agent = RemoteAgent(link=link, config=config, runtime=runtime)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield agent, thread
    finally:
        stop.set()
        thread.join(timeout=20)
