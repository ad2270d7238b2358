"""The Celery worker process: `celery -A worker.celery worker` (the compose `worker` service).

The app, its queues and the names of its tasks are web/tasks.py's (web sends every job
there and never imports this package); this module sets Django up for the worker, registers
the thin tasks (worker/tasks.py, worker/model_tasks.py) and the worker's start-up hooks.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import django
from celery.signals import worker_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup()

from django.conf import settings  # noqa: E402

from appliance.runtime.containers import EngineRuntime  # noqa: E402
from appliance.runtime.engine_network import join_engine_network  # noqa: E402
from web import tasks  # noqa: E402

log = logging.getLogger(__name__)

app = tasks.app
app.autodiscover_tasks(["worker"], related_name="tasks")
app.autodiscover_tasks(["worker"], related_name="model_tasks")


@worker_ready.connect
def resume_model_downloads(sender: Any = None, **_: Any) -> None:
    """A worker killed mid-download left its entries downloading: queue their jobs again
    (each waits for the dead job's lease to run out, then resumes from the bytes on disk),
    and scan the roots, so folders copied in while it was down are listed. Only a worker
    that consumes the models queue does it."""
    consumer = getattr(sender, "app", app).amqp.queues.consume_from
    if consumer is None or tasks.QUEUE_OF[tasks.MODEL_DOWNLOAD] in consumer:
        tasks.model_downloads_resume_later()
        tasks.model_store_scan_later()


@worker_init.connect
def join_engine_network_on_start(**_: Any) -> None:
    """Benchmarks (queue bench) talk to engines by container name, so under compose the
    worker joins the engine network as the agent does; Redis and PostgreSQL stay on
    `internal`, where engines never are. A worker outside a container is a no-op.

    Why here and not in a service of its own: each GPU host runs a worker beside its agent
    (docs/fleet.md); an engine network is a bridge local to
    its host, so a benchmark runs on the worker of the host that holds its engines.
    """
    try:
        join_engine_network(EngineRuntime(), settings.ENGINE_NETWORK)
    except Exception:  # no Docker: builds fail on their own; say why benchmarks will
        log.exception("could not join the engine network %r: benchmarks cannot reach "
                      "engines from this worker", settings.ENGINE_NETWORK)
