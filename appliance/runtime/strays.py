"""A host's strays: containers with the appliance's labels that no engine of this install
its agent knows of owns (made by hand, another install's, or left running by `docker
compose down -v`, which deletes the database and so makes a new install). An agent lists
them in its host's report and warns once of each new one; the Hosts page shows them. They
are never adopted or stopped.

A joined host's agent knows the engines placed on it (its placements read): a container of
this install whose deployment and start token are not among them is a stray there. The
panel checks what a heartbeat carries against the limits below (a 400 naming the field),
so the agent never sends more.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from docker.models.containers import Container

from appliance.runtime.container_plan import LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_START
from appliance.runtime.containers import EngineRuntime

log = logging.getLogger(__name__)

LABEL_PREFIX = "appliance."
MAX_STRAYS = 64  # listed in one report, by name
MAX_NAME = 255
MAX_STATUS = 32
MAX_LABELS = 16
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 256


def strays_found(runtime: EngineRuntime, *, instance: str,
                 owned: Collection[tuple[str, str]]) -> list[dict[str, Any]]:
    """The host's containers with the appliance's labels that are not this install's
    (`instance`) or whose (deployment id, start token) is not in `owned`: each as
    {name, status, labels} (the appliance's labels only), by name, at most MAX_STRAYS."""
    strays = []
    for container in runtime.list_managed():
        labels = container.labels or {}
        key = (labels.get(LABEL_DEPLOYMENT, ""), labels.get(LABEL_START, ""))
        if labels.get(LABEL_INSTANCE) != instance or key not in owned:
            strays.append(_stray(container, labels))
    return sorted(strays, key=lambda s: s["name"])[:MAX_STRAYS]


def _stray(container: Container, labels: dict[str, str]) -> dict[str, Any]:
    kept = sorted((k, str(v)[:MAX_LABEL_VALUE]) for k, v in labels.items()
                  if k.startswith(LABEL_PREFIX) and len(k) <= MAX_LABEL_KEY)
    return {"name": str(container.name)[:MAX_NAME], "status": str(container.status)[:MAX_STATUS],
            "labels": dict(kept[:MAX_LABELS])}


def strays_warning(names: list[str]) -> str:
    return (f"containers with the appliance's labels that no deployment of this install owns: "
            f"{', '.join(names)} (an engine left running by `docker compose down -v`, which "
            "deletes the database, is one; a running one keeps its GPUs). They are never "
            f"adopted or stopped; if they are yours, remove them: docker rm -f {' '.join(names)}")


class StraysSaid:
    """The agent's warning of its host's strays, said when a name is new (the Hosts page
    lists them all, every report)."""

    def __init__(self) -> None:
        self._said: frozenset[str] = frozenset()

    def say(self, strays: list[dict[str, Any]]) -> None:
        names = frozenset(str(c["name"]) for c in strays)
        if names - self._said:
            log.warning("%s", strays_warning(sorted(names)))
        self._said = names
