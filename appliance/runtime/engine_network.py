"""The engine network under compose: made once, this container on it, and the services
that relay /v1 calls to the engines on it too. Docker only: the host's agent with
APPLIANCE_ENGINE_NETWORK (the panel's own, under compose) and the Celery worker (its
benchmarks reach engines by container name) call it at start.
"""

from __future__ import annotations

import logging
import socket

from appliance.runtime.containers import (
    EngineRuntime,
    network_is_closed,
    open_network_warning,
)

log = logging.getLogger(__name__)

# The compose services that relay /v1 to engines (compose.yaml): web's own gateway and the
# gateway instances in front of which the proxy sits.
RELAYS = ("web", "gateway-a", "gateway-b")


def join_engine_network(runtime: EngineRuntime, name: str,
                        relays: tuple[str, ...] = RELAYS) -> str:
    """Make the engine network `name` and put this container on it, and the containers of
    `relays` in the same compose project too. Returns what is wrong with the network for the
    host's report (an open network an older version left, engines on it), else ''.

    Engines sit on their own network, apart from Redis and PostgreSQL (engines run model
    code with trust_remote_code); the agent reaches them there by container name. The relay
    services have no Docker socket, so the agent connects them (once per container: the
    attachment outlives restarts); connecting a running container briefly drops its
    published port, which happens here at the first start only, right after web turned
    healthy (the proxy's, which publishes the panel's, is never connected). No name: ''.
    """
    if not name:
        return ""
    network = runtime.ensure_network(name)
    note = "" if network_is_closed(network.attrs) else open_network_warning(name, "in use")
    me = socket.gethostname()
    if runtime.join_network(network, me):
        log.info("engine network %s joined", name)
        for service in relays:
            for peer in runtime.compose_peers(me, service):
                runtime.join_network(network, peer)
    # else: not in a container (a host install); engines publish on loopback instead
    return note
