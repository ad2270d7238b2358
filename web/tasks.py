"""Every Celery task the appliance sends, by one typed function each; the tasks' names and
queues; and the Celery app (configured from Django's settings).

Web code queues a job here (`tasks.deployment_start_later(pk)`) and never imports
worker/: the worker's thin tasks (worker/tasks.py, worker/model_tasks.py) register under
the names below, so the dependency runs one way, worker -> web -> appliance. Each job is
sent once the caller's transaction commits (at once outside one), so a worker never looks
for a row that is not there yet.

Queues, each so one kind of job never waits behind another's (a worker with no -Q consumes
them all; under several hosts each runs its own):

    builds  image builds (hours with CUDA kernels), then the hand-over to the engine agent
    bench   benchmark sweeps and losslessness checks (they talk to engines)
    models  model downloads and scans, root read rates (they read the same disks)

Stopping an engine is no task: the engine agent, which owns the containers, carries out
a stop at its next tick (appliance/runtime/remote_agent.py, which reads the row's
`stopping` in its placements), so a stop never waits behind a job.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from django.conf import settings
from django.db import transaction
from kombu import Queue

DEPLOYMENT_START = "worker.tasks.deploy"
BENCHMARK_RUN = "worker.tasks.benchmark"
VERIFICATION_RUN = "worker.tasks.verification"
TUNE_RUN = "worker.tasks.tune"
TUNE_APPLY = "worker.tasks.tune_apply"
ROOT_READ_RATE = "worker.tasks.store_read_rate"
MODEL_DOWNLOAD = "worker.model_tasks.model_download"
MODEL_DOWNLOADS_RESUME = "worker.model_tasks.model_downloads_resume"
MODEL_STORE_SCAN = "worker.model_tasks.model_store_scan"

QUEUE_OF = {
    DEPLOYMENT_START: "builds",
    BENCHMARK_RUN: "bench",
    VERIFICATION_RUN: "bench",
    TUNE_RUN: "bench",
    TUNE_APPLY: "bench",
    ROOT_READ_RATE: "models",
    MODEL_DOWNLOAD: "models",
    MODEL_DOWNLOADS_RESUME: "models",
    MODEL_STORE_SCAN: "models",
}
QUEUES = tuple(dict.fromkeys(QUEUE_OF.values()))

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
    task_queues=[Queue(name, routing_key=name) for name in QUEUES],
    task_default_queue=QUEUES[0],
    task_routes={name: {"queue": queue} for name, queue in QUEUE_OF.items()},
)


def _send_on_commit(name: str, *args: Any, countdown: float | None = None) -> None:
    def send() -> None:
        app.send_task(name, args=list(args), queue=QUEUE_OF[name], countdown=countdown)

    transaction.on_commit(send)


def deployment_start_later(deployment_id: int, *, countdown: float | None = None) -> None:
    """The deploy job: wait for the models, build or find the image, hand over to the agent."""
    _send_on_commit(DEPLOYMENT_START, deployment_id, countdown=countdown)


def benchmark_run_later(run_id: int) -> None:
    _send_on_commit(BENCHMARK_RUN, run_id)


def verification_run_later(run_id: int) -> None:
    _send_on_commit(VERIFICATION_RUN, run_id)


def tune_run_later(run_id: int) -> None:
    _send_on_commit(TUNE_RUN, run_id)


def tune_apply_later(run_id: int) -> None:
    _send_on_commit(TUNE_APPLY, run_id)


def root_read_rate_later(root: str) -> None:
    """A model root's read rate, measured on its own weight files."""
    _send_on_commit(ROOT_READ_RATE, root)


def model_download_later(entry_id: int) -> None:
    _send_on_commit(MODEL_DOWNLOAD, entry_id)


def model_downloads_resume_later() -> None:
    """Downloads a dead worker left running, queued again (each resumes from disk)."""
    _send_on_commit(MODEL_DOWNLOADS_RESUME)


def model_store_scan_later() -> None:
    """The model roots looked through: folders copied in by hand become entries."""
    _send_on_commit(MODEL_STORE_SCAN)
