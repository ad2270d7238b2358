"""The Celery app: Redis broker, Django settings, thin tasks in worker.tasks."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup()

from django.conf import settings  # noqa: E402

app = Celery("appliance")
app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    task_acks_late=settings.CELERY_TASK_ACKS_LATE,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=settings.CELERY_WORKER_PREFETCH_MULTIPLIER,
    task_always_eager=settings.CELERY_TASK_ALWAYS_EAGER,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    # A deploy watch can take as long as a 590 GB model load; the broker must not redeliver early.
    broker_transport_options={"visibility_timeout": 4 * 3600},
    beat_schedule={
        "supervise": {"task": "worker.tasks.supervise", "schedule": settings.SUPERVISE_INTERVAL_S},
    },
)
app.autodiscover_tasks(["worker"], related_name="tasks")
