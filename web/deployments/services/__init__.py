"""Writes: the deployment actions, the status moves, the event log.

The modules, by theme: deployments (the actions on a deployment's own rows: stop,
restart, delete; recipes), rolling (Restart and Redeploy of a deployment with
replicas, one replica at a time), lifecycle (the one writer of `status`: appliance.lifecycle's
table applied), events (the event log and its live stream), gpus (the GPU leases' hook:
web/fleet/leases.py owns the leases and registers them there), hosts (what a GPU host can
do, from its agent's reports: pre-flight's facts of the host placement chose), errors
(DeploymentInputError).
The host API (web/fleet/) applies the engine agents' steps through these, and the build
worker (web/builder/) calls them; never the reverse.
Callers import from here: `from web.deployments import services; services.deployment_stop(...)`.
Deploying a spec (validate, place, create, redeploy, scale) is web/deploy/services.py's.
"""

from __future__ import annotations

from .deployments import (
    deployment_delete,
    deployment_hosts,
    deployment_restart,
    deployment_set_progress,
    deployment_stop,
    recipe_load,
    recipe_names,
)
from .errors import DeploymentInputError
from .events import events_append, events_append_batch, events_batches_quiet
from .lifecycle import (
    ADVANCE,
    deployment_mark_build_stopped,
    deployment_mark_building,
    deployment_mark_capturing,
    deployment_mark_checking,
    deployment_mark_failed,
    deployment_mark_loading,
    deployment_mark_ready,
    deployment_mark_starting,
    deployment_mark_stopped,
    deployment_mark_stopping,
    deployment_restart_after_death,
)
from .rolling import rolling_end, rolling_start, rolling_text, rolling_tick

__all__ = [
    "ADVANCE",
    "DeploymentInputError",
    "deployment_delete",
    "deployment_hosts",
    "deployment_mark_build_stopped",
    "deployment_mark_building",
    "deployment_mark_capturing",
    "deployment_mark_checking",
    "deployment_mark_failed",
    "deployment_mark_loading",
    "deployment_mark_ready",
    "deployment_mark_starting",
    "deployment_mark_stopped",
    "deployment_mark_stopping",
    "deployment_stop",
    "deployment_restart",
    "deployment_restart_after_death",
    "deployment_set_progress",
    "events_append",
    "events_append_batch",
    "events_batches_quiet",
    "recipe_load",
    "recipe_names",
    "rolling_end",
    "rolling_start",
    "rolling_text",
    "rolling_tick",
]
