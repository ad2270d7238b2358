"""Placement: the host and GPUs each replica row of a deployment runs on, and why.

A spec's `host:` names the host for every replica (refused, naming why, when it is
unknown, lost, draining or lacks the GPUs); without it the panel chooses among the hosts
that take new engines: the joined hosts whose heartbeat is fresh and that are not drained,
and the panel's own host (APPLIANCE_HOST_NAME). Every replica row gets a Placement on the
host it runs on, the own host's too. Until its agent joins (with the token the panel loop
keeps for it), the own host's row has no credential that opens anything, so its
Placements scope no host API write. It is never refused for its agent's silence (the page
says the agent is silent); it ranks after the ready hosts then.

Replica 0 keeps the spec's GPU ids (the spec as written); each other replica takes as many
GPUs, preferring a host this deployment does not use yet (spread), then other GPUs of a
host it does. Among hosts equal on that, the panel's own host comes first while it has the
GPUs (a spec without `host:` on the one-host product runs where it always did), then the
joined host with the fewest engines. No shipped recipe names a GPU kind, so a GPU is a GPU
here; the pre-flight rules check the architecture the spec needs (fa3 on Hopper).

The choice is a read: two requests may choose the same GPUs, and the GPU leases' unique
index (leases.py) lets one through, in the transaction that makes the rows. Where only one
host could take replica 0 it is chosen even with its GPUs held, so the lease's refusal names
the holder, as on the one-host product.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from web.deployments.models import Deployment

from .heartbeat import host_state
from .models import FleetHost, GpuLease, Placement, unjoined_credential

MAX_REASON = 300


class PlacementRefused(ValueError):
    """No host can take a replica: `field` is the spec key to change, the message says
    what each host lacks."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Candidate:
    """A host as the placement sees it now."""

    name: str
    joined: bool  # False: the panel's own host (whether or not its agent joined)
    state: str  # ready, draining, lost; the panel's own host: ready or silent
    gpus: dict[int, str]  # index -> the GPU's name ("" when the host gave a count)
    held: dict[int, str] = field(default_factory=dict)  # index -> who holds it
    engines: set[int] = field(default_factory=set)  # deployments leasing GPUs here
    taken: set[int] = field(default_factory=set)  # chosen for earlier replicas of this pass
    taken_by: dict[int, int] = field(default_factory=dict)  # GPU -> that replica's index

    def free(self) -> list[int]:
        return sorted(set(self.gpus) - set(self.held) - self.taken)

    def kind(self) -> str:
        names = {self.gpus[i].removeprefix("NVIDIA ") for i in self.free() if self.gpus[i]}
        return f" {names.pop()}" if len(names) == 1 else ""

    @property
    def takes_new(self) -> bool:
        return self.state in ("ready", "silent")


@dataclass(frozen=True)
class Choice:
    """Where one replica row goes."""

    replica: int
    host: str
    joined: bool
    gpus: list[int]
    reason: str


def placement_candidates(*, exclude_pk: int | None = None) -> dict[str, Candidate]:
    """Every host with its GPUs, who holds each, and its state, by name."""
    now = timezone.now()
    own = str(settings.HOST_NAME)
    hosts = {h.name: Candidate(name=h.name, joined=True, state=host_state(host=h, now=now),
                               gpus={int(g["index"]): str(g.get("name") or "")
                                     for g in h.gpus or [] if isinstance(g.get("index"), int)})
             for h in FleetHost.objects.joined().exclude(name=own)}
    hosts[own] = _own_host(own, now)
    leases = GpuLease.objects.select_related("deployment").order_by("host", "gpu_index")
    if exclude_pk is not None:
        leases = leases.exclude(deployment_id=exclude_pk)
    for lease in leases:
        host = hosts.get(lease.host)
        if host is not None:
            d = lease.deployment  # the row that holds it, named as its own page is
            host.held[lease.gpu_index] = f"{d.name} #{d.pk}" + (
                f" (replica {d.replica_index} of #{d.replica_of_id})" if d.replica_of_id else "")
            host.engines.add(d.pk)
    return hosts


def _own_host(name: str, now: object) -> Candidate:
    """The panel's own host, whether its agent joined with the own host's token or writes
    the database itself: the GPUs its agent reported (NVML's, or its stated count), else
    APPLIANCE_GPU_COUNT; silent when its agent reported once and not lately (never refused
    for it, never lost); draining when an admin drained it."""
    report = FleetHost.objects.filter(name=name, heartbeat_at__isnull=False).first()
    if report is not None and report.is_joined:  # its heartbeat's GPUs, as any joined host's
        listed = {int(g["index"]): str(g.get("name") or "") for g in report.gpus or []
                  if isinstance(g, dict) and isinstance(g.get("index"), int)}
    else:  # the NVML snapshot its database-writing agent reported
        telemetry = (report.gpu_telemetry or {}) if report else {}
        listed = {int(g["index"]): str(g.get("name") or "") for g in telemetry.get("gpus") or []
                  if isinstance(g, dict) and isinstance(g.get("index"), int)
                  } if telemetry.get("available") else {}
    gpus = listed or {i: "" for i in range(int(settings.GPU_COUNT))}
    fresh = timedelta(seconds=int(getattr(settings, "AGENT_SILENT_S", 30)))
    silent = report is not None and now - report.heartbeat_at > fresh  # type: ignore[operator]
    # Drained (an admin can drain it once its agent has joined): nothing new goes there.
    state = ("draining" if report is not None and report.draining
             else "silent" if silent else "ready")
    return Candidate(name=name, joined=False, state=state, gpus=gpus)


def deployment_place(*, gpus: Sequence[int], host: str | None, replicas: Iterable[int],
                     used: Iterable[str] = (), exclude_pk: int | None = None) -> list[Choice]:
    """A host and GPUs for each replica index in `replicas`, or PlacementRefused naming
    what each host lacks. `used`: the hosts the deployment's other running replicas are on
    (a Scale keeps spreading)."""
    hosts = placement_candidates(exclude_pk=exclude_pk)
    named = _named(hosts, host) if host else None
    spread: dict[str, int] = {}
    for name in used:
        spread[name] = spread.get(name, 0) + 1
    choices = []
    for replica in replicas:
        choice = _place_one(hosts, named, list(gpus), replica, spread)
        hosts[choice.host].taken.update(choice.gpus)
        hosts[choice.host].taken_by.update({g: replica for g in choice.gpus})
        spread[choice.host] = spread.get(choice.host, 0) + 1
        choices.append(choice)
    return choices


def _named(hosts: dict[str, Candidate], name: str) -> Candidate:
    host = hosts.get(name)
    if host is None:
        known = ", ".join(f"{h.name}{'' if h.joined else ' (this panel)'}"
                          for h in sorted(hosts.values(), key=lambda h: h.name))
        raise PlacementRefused("host", f"No host {name!r} in the fleet; the hosts are {known}. "
                               "Name one of them, or leave host out to let the panel place it.")
    if not host.takes_new:
        why = "its heartbeat stopped" if host.state == "lost" else "no new engine goes there"
        raise PlacementRefused("host", f"Host {name} is {host.state}: {why}. Choose another "
                               "host, or leave host out to let the panel place it.")
    return host


def _fits(host: Candidate, gpus: list[int], replica: int) -> list[int] | None:
    """The GPUs the replica takes on the host, or None when they are not free there."""
    free = host.free()
    if replica == 0:
        return gpus if set(gpus) <= set(free) else None
    if len(free) < len(gpus):
        return None
    return gpus if set(gpus) <= set(free) else free[:len(gpus)]


def _place_one(hosts: dict[str, Candidate], named: Candidate | None, gpus: list[int],
               replica: int, spread: dict[str, int]) -> Choice:
    pool = [named] if named else [h for h in hosts.values() if h.takes_new]
    fitting = [(h, got) for h in pool if (got := _fits(h, gpus, replica)) is not None]
    if not fitting:
        if replica == 0 and len(pool) == 1 and (named or len(hosts) == 1):
            # One possible host: the lease refuses, naming each held GPU and its holder.
            only = pool[0]
            return Choice(replica, only.name, only.joined, gpus, _reason(only, [], hosts, named))
        raise PlacementRefused("gpus" if replica == 0 else "replicas",
                               _refusal(hosts, pool, gpus, replica))
    fitting.sort(key=lambda c: (spread.get(c[0].name, 0), c[0].state != "ready", c[0].joined,
                                len(c[0].engines), c[0].name))
    best, got = fitting[0]
    others = [h for h, _ in fitting[1:]]
    return Choice(replica, best.name, best.joined, got,
                  _reason(best, others, hosts, named, spread))


def _reason(best: Candidate, others: list[Candidate], hosts: dict[str, Candidate],
            named: Candidate | None, spread: dict[str, int] | None = None) -> str:
    """Why this host: what it has, what put it before the other hosts that could take the
    replica, and why the rest could not."""
    spread = spread or {}
    free = best.free()
    head = f"{best.name}: {len(free)} free{best.kind()} GPU{'s' if len(free) != 1 else ''}"
    if named is not None:
        return f"{head}, named by the spec's host"[:MAX_REASON]
    why = []
    if best.state == "silent":
        why.append("this panel's host, its agent silent (no ready host had the GPUs)")
    elif any(spread.get(o.name, 0) > spread.get(best.name, 0) for o in others):
        mine = spread.get(best.name, 0)
        why.append("no replica of this deployment there yet" if not mine else
                   f"fewest replicas of this deployment there ({mine})")
    elif not best.joined:
        why.append("this panel's host")
    elif any(len(o.engines) > len(best.engines) for o in others):
        why.append("fewest engines")
    fitting = {best.name, *(o.name for o in others)}
    notes = [f"{h.name} {h.state}" if not h.takes_new else f"{h.name} lacks the GPUs"
             for h in sorted(hosts.values(), key=lambda h: h.name) if h.name not in fitting]
    return "; ".join([", ".join([head, *why]), *notes])[:MAX_REASON]


def _refusal(hosts: dict[str, Candidate], pool: list[Candidate], gpus: list[int],
             replica: int) -> str:
    need = (f"GPU{'s' if len(gpus) != 1 else ''} {', '.join(map(str, gpus))} free on one host"
            if replica == 0 else f"{len(gpus)} free GPU{'s' if len(gpus) != 1 else ''} on one "
            "host")
    parts = []
    for h in sorted(pool if len(pool) == 1 else hosts.values(), key=lambda h: h.name):
        if not h.takes_new:
            parts.append(f"{h.name} is {h.state}")
            continue
        free = h.free()
        busy = [f"GPU {i} held by {h.held[i]}" for i in sorted(h.held)
                if i in gpus or replica > 0][:4]
        busy += [f"GPU {i} taken by replica {h.taken_by[i]}" for i in sorted(h.taken)
                 if i in gpus or replica > 0][:4]
        missing = [i for i in gpus if i not in h.gpus] if replica == 0 else []
        if missing:
            busy.append(f"no GPU {', '.join(map(str, missing))}")
        parts.append(f"{h.name} has {len(free)} free" + (f" ({'; '.join(busy)})" if busy
                                                          else ""))
    which = "Replica 0" if replica == 0 else f"Replica {replica}"
    fix = ("stop a deployment that holds them, choose other GPUs, or join a host with them."
           if replica == 0 else "ask for fewer replicas, stop a deployment that holds GPUs, "
           "or join another host.")
    return f"{which} needs {need}: {', '.join(parts)}. Fix: {fix}"


def placement_store(*, deployment: Deployment, choice: Choice) -> None:
    """Record a row's placement: on its row (its reads show it) and as the fleet Placement
    of the host it runs on, the panel's own included (its host row is made, with a
    credential nothing opens, if its agent has not reported yet). On a joined host the
    Placement scopes what that host may write. The caller's transaction."""
    Deployment.objects.filter(pk=deployment.pk).update(
        host=choice.host, gpus=choice.gpus, placement_reason=choice.reason)
    deployment.host, deployment.gpus = choice.host, choice.gpus
    deployment.placement_reason = choice.reason
    Placement.objects.filter(deployment=deployment).delete()
    if choice.joined:
        host = FleetHost.objects.joined().get(name=choice.host)
    else:  # the panel's own host, joined or not (settings refuse a name no row can carry)
        host, _ = FleetHost.objects.get_or_create(
            name=choice.host,
            defaults={"credential_made_at": timezone.now(), **unjoined_credential()})
    Placement.objects.create(deployment=deployment, replica=choice.replica, host=host,
                             reason=choice.reason)
