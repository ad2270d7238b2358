"""The Celery app: Redis broker, Django settings, thin tasks in worker.tasks."""

from __future__ import annotations

import logging
import os
from typing import Any

import django
from celery import Celery
from celery.signals import worker_init, worker_ready
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup()

from django.conf import settings  # noqa: E402

log = logging.getLogger(__name__)

app = Celery("appliance")
app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    task_acks_late=settings.CELERY_TASK_ACKS_LATE,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=settings.CELERY_WORKER_PREFETCH_MULTIPLIER,
    task_always_eager=settings.CELERY_TASK_ALWAYS_EAGER,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    # An image build (CUDA kernels) can take hours; the broker must not redeliver it early.
    # A build whose worker died is queued again by the engine agent (its lease ran out).
    broker_transport_options={"visibility_timeout": 4 * 3600},
    # Separate queues: a stop never waits behind image builds. A worker with no -Q
    # consumes both.
    task_queues=[Queue("control", routing_key="control"),
                 Queue("builds", routing_key="builds"),
                 Queue("bench", routing_key="bench"),
                 Queue("models", routing_key="models")],
    task_default_queue="control",
    task_routes={"worker.tasks.deploy": {"queue": "builds"},
                 "worker.tasks.stop": {"queue": "control"},
                 "worker.tasks.benchmark": {"queue": "bench"},
                 "worker.tasks.verification": {"queue": "bench"},
                 # Model downloads (web/store): hours long, never ahead of a stop or a build.
                 "worker.model_tasks.*": {"queue": "models"}},
)
app.autodiscover_tasks(["worker"], related_name="tasks")
app.autodiscover_tasks(["worker"], related_name="model_tasks")


@worker_ready.connect
def resume_model_downloads(sender: Any = None, **_: Any) -> None:
    """A worker killed mid-download left its entries downloading: queue their jobs again
    (each waits for the dead job's lease to run out, then resumes from the bytes on disk),
    and scan the roots, so folders copied in while it was down are listed. Only a worker
    that consumes the models queue does it."""
    consumer = getattr(sender, "app", app).amqp.queues.consume_from
    if consumer is None or "models" in consumer:
        app.send_task("worker.model_tasks.model_downloads_resume")
        app.send_task("worker.model_tasks.model_store_scan")


@worker_init.connect
def join_engine_network_on_start(**_: Any) -> None:
    """Benchmarks (queue bench) talk to engines by container name, so under compose the
    worker joins the engine network as the agent does; Redis and PostgreSQL stay on
    `internal`, where engines never are. A worker outside a container is a no-op.

    Why here and not in a service of its own: each GPU host runs a worker beside its agent
    (shared/DESIGN.md "Growing past one machine"); an engine network is a bridge local to
    its host, so a benchmark runs on the worker of the host that holds its engines.
    """
    from appliance.runtime.containers import EngineRuntime
    from web.deployments.services.agent import join_engine_network

    try:
        join_engine_network(EngineRuntime())
    except Exception:  # no Docker: builds fail on their own; say why benchmarks will
        log.exception("could not join the engine network %r: benchmarks cannot reach "
                      "engines from this worker", settings.ENGINE_NETWORK)
