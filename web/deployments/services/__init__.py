"""Writes: creating deployments, moving their status, appending events.

Every status change is one function per edge, a conditional UPDATE on the
expected source states; zero rows updated means someone else won.

The modules, by theme: deployments (validate, create, status transitions, stop
requests), events (the event log and its live stream), builds (the engine image),
engines (what to start and its identity), agent (the engine agent that owns running
engines), hosts (what the GPU host's Docker can do, start-failure diagnoses). Callers import from
here: `from web.deployments import services; services.deployment_create(...)`.
"""

from __future__ import annotations

from .agent import EngineAgent, agent_run_forever, wait_for
from .deployments import (
    ADVANCE,
    DeploymentInputError,
    deployment_create,
    deployment_mark_building,
    deployment_mark_capturing,
    deployment_mark_checking,
    deployment_mark_failed,
    deployment_mark_loading,
    deployment_mark_ready,
    deployment_mark_starting,
    deployment_mark_stopped,
    deployment_mark_stopping,
    deployment_request_stop,
    deployment_set_progress,
    deployment_validate,
    recipe_load,
    recipe_names,
)
from .engines import container_plan as container_plan  # the worker tests build a plan
from .engines import deployment_run, deployment_stop, identity_of
from .events import events_append, events_append_batch, events_batches_quiet
from .leases import gpu_leases_acquire, gpu_leases_release

__all__ = [
    "ADVANCE",
    "EngineAgent",
    "agent_run_forever",
    "identity_of",
    "wait_for",
    "DeploymentInputError",
    "deployment_create",
    "deployment_mark_building",
    "deployment_mark_capturing",
    "deployment_mark_checking",
    "deployment_mark_failed",
    "deployment_mark_loading",
    "deployment_mark_ready",
    "deployment_mark_starting",
    "deployment_mark_stopped",
    "deployment_mark_stopping",
    "deployment_request_stop",
    "deployment_run",
    "deployment_set_progress",
    "deployment_stop",
    "deployment_validate",
    "events_append",
    "events_append_batch",
    "events_batches_quiet",
    "gpu_leases_acquire",
    "gpu_leases_release",
    "recipe_load",
    "recipe_names",
]
