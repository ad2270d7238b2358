"""A deployment's lifecycle: its statuses, the one table of moves between them, and who
makes each move.

    status     may come from                                            made by
    ---------- -------------------------------------------------------  ----------------------------
    queued     stopped, failed                                          web (Restart)
    queued     stopped, failed                                          roller (a replica's new run)
    building   queued                                                   build worker (no image yet)
    starting   queued, building                                         build worker (image exists)
    starting   ready                                                    agent (restart policy)
    checking   starting                                                 agent (GPU self-check)
    loading    starting, checking                                       agent (weights)
    capturing  starting, checking, loading                              agent (CUDA graphs)
    ready      starting, checking, loading, capturing                   agent (/health, one token)
    stopping   building, starting, checking, loading, capturing, ready  web (Stop)
    stopping   queued, building, starting, checking, loading, capturing, ready  roller (its turn)
    stopped    queued                                                   web (Stop, nothing ran)
    stopped    stopping                                                 agent (container gone)
    stopped    stopping                                                 build worker (no engine ran)
    failed     queued, building                                         build worker (model, build)
    failed     starting, checking, loading, capturing, ready            agent (engine failed)

The roller is a rolling change's step machine (web/deployments/services/rolling.py, run by
the panel loop, web/loop.py): it stops one replica of a deployment at a time, once drained, and
queues its next run, the moves web makes for Stop and Restart on a person's behalf.

Stopped and failed are terminal (the deployment's GPUs are free again); the agent owns a
deployment's engine from `starting` until it is stopped or failed. Code in `web/` moves a
status only through this table (web/deployments/services/lifecycle.py applies it as one
conditional UPDATE; tests/web/test_status_writes.py fails on any other write of it;
tests/web/test_architecture_doc.py holds this drawing and docs/architecture.md's to the
table).

Framework-free: the engine follower (appliance.runtime.follower) reads the engine phases
from here, the Django side builds its choices and status sets from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    QUEUED = "queued"
    BUILDING = "building"
    STARTING = "starting"
    CHECKING = "checking"  # the GPU self-check, before the model load
    LOADING = "loading"
    CAPTURING = "capturing"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class Process(StrEnum):
    """The processes that move a status (docs/architecture.md, Processes: web, Celery
    workers, the agent)."""

    WEB = "web"
    BUILDER = "build worker"
    AGENT = "agent"
    ROLLER = "roller"  # a rolling change's steps, in the agent's loop (not an engine's move)


@dataclass(frozen=True)
class Move:
    target: Status
    sources: frozenset[Status]
    by: Process
    why: str


def _move(target: Status, sources: str, by: Process, why: str) -> Move:
    return Move(target, frozenset(Status(s) for s in sources.split()), by, why)


S, P = Status, Process
TRANSITIONS: tuple[Move, ...] = (
    _move(S.QUEUED, "stopped failed", P.WEB, "Restart: a new run of the same spec"),
    _move(S.QUEUED, "stopped failed", P.ROLLER,
          "a rolling change's new run of this replica (a new spec, for a redeploy)"),
    _move(S.BUILDING, "queued", P.BUILDER, "no image yet: build it"),
    _move(S.STARTING, "queued building", P.BUILDER, "the image exists"),
    _move(S.STARTING, "ready", P.AGENT, "restart policy: the engine died while serving"),
    _move(S.CHECKING, "starting", P.AGENT, "the GPU self-check began"),
    _move(S.LOADING, "starting checking", P.AGENT, "the weights began to load"),
    _move(S.CAPTURING, "starting checking loading", P.AGENT, "CUDA-graph capture began"),
    _move(S.READY, "starting checking loading capturing", P.AGENT,
          "/health turned 200 and a one-token generation passed"),
    _move(S.STOPPING, "building starting checking loading capturing ready", P.WEB,
          "Stop on a deployment with an engine or a build"),
    _move(S.STOPPING, "queued building starting checking loading capturing ready", P.ROLLER,
          "a rolling change stops this replica, drained, for its new run"),
    _move(S.STOPPED, "queued", P.WEB, "Stop before anything ran"),
    _move(S.STOPPED, "stopping", P.AGENT, "the engine container is gone"),
    _move(S.STOPPED, "stopping", P.BUILDER,
          "its build was stopped before any engine of the run started (no start token)"),
    _move(S.FAILED, "queued building", P.BUILDER, "a model download or the image build failed"),
    _move(S.FAILED, "starting checking loading capturing ready", P.AGENT,
          "the engine failed to start, or failed or died"),
)



def sources_of(target: Status, *, by: Process) -> frozenset[Status]:
    """The statuses `by` may move a deployment from into `target`; empty: it never may."""
    return frozenset(s for m in TRANSITIONS if m.target == target and m.by == by
                     for s in m.sources)


TERMINAL = frozenset({S.STOPPED, S.FAILED})
ACTIVE = frozenset(Status) - TERMINAL
# The agent owns a deployment while it may make a move from its status: the engine's life.
AGENT_OWNED = frozenset(s for m in TRANSITIONS if m.by == P.AGENT for s in m.sources)
# The engine container may be running in these (stopping is the agent's end of it).
RUNNING = AGENT_OWNED - {S.STOPPING}
# The phases the agent moves a starting engine through, in order: each may come from every
# earlier one (a phase the engine skips, such as the self-check, is passed over).
_FORWARD = [m for m in TRANSITIONS
            if m.by == P.AGENT and S.STARTING in m.sources and m.target not in TERMINAL]
ENGINE_PHASES: tuple[Status, ...] = (
    S.STARTING, *(m.target for m in sorted(_FORWARD, key=lambda m: len(m.sources))))
