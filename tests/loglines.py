"""Whether every line an engine printed is stored once, in order: Docker's own log of the
engine container against the deployment's `log` events (the fault tests' measure)."""

from __future__ import annotations

import time
from collections.abc import Callable

import docker
from appliance.runtime.container_plan import Identity
from appliance.runtime.follower import SCRAPE_ACCESS
from web.deployments.models import Deployment
from web.deployments.services.installation import instance_id

Lines = Callable[[list[str]], list[str]]


def printed_lines(pk: int) -> list[str]:
    """What the engine printed, stdout and stderr in Docker's order ("\\r" updates folded)."""
    deployment = Deployment.objects.get(pk=pk)
    identity = Identity(str(pk), instance_id(), deployment.start_token)
    container = docker.from_env().containers.get(identity.name)
    raw = container.logs(stdout=True, stderr=True, timestamps=True).decode()
    lines = [line.split(" ", 1)[1] if " " in line else "" for line in raw.split("\n") if line]
    # The agent's own /metrics scrapes are not stored (appliance.runtime.follower).
    return [line.rsplit("\r", 1)[-1] for line in lines if not SCRAPE_ACCESS.match(line)]


def stored_lines(pk: int) -> list[str]:
    deployment = Deployment.objects.get(pk=pk)
    return [e.payload["text"] for e in deployment.events.filter(kind="log").order_by("seq")]


def assert_every_line_once(pk: int, settle_s: float = 5, *,
                           printed_as: Lines = lambda lines: lines,
                           stored_as: Lines = lambda lines: lines) -> None:
    """`printed_as` and `stored_as` say how each side reads (a fleet host masks the engine's
    key and ships its own notes as lines)."""
    deadline = time.monotonic() + settle_s
    while True:
        printed, stored = printed_as(printed_lines(pk)), stored_as(stored_lines(pk))
        if stored == printed or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    # The first line where the two differ (or where the shorter one ends).
    first = next((i for i in range(max(len(stored), len(printed)))
                  if i >= min(len(stored), len(printed)) or stored[i] != printed[i]), None)
    seen = f"first difference at line {first}: stored {stored[first:first + 3]!r}, printed " \
        f"{printed[first:first + 3]!r}" if first is not None else ""
    assert len(stored) == len(printed), (len(stored), len(printed), seen)
    assert stored == printed, f"every printed line stored exactly once, in order: {seen}"
    seqs = list(Deployment.objects.get(pk=pk).events.order_by("seq")
                .values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)), "a gap-free event log"
