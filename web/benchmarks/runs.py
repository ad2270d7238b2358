"""What every background run shares (a benchmark, a losslessness check, a Tune): its row's
common columns and states, and the moves of its status, each a conditional UPDATE so that a
cancel and the task's own end never overwrite each other.

queued -> running (the task claims it) -> done | failed | cancelled; running -> cancelling
(a cancel asked; the task sees it at its next poll) -> cancelled. A queued run cancelled
ends at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import models
from django.utils import timezone

from .choices import ACTIVE_STATUSES, BenchmarkStatus

POLL_S = 0.5


class BackgroundRun(models.Model):
    name = models.CharField(max_length=100, blank=True, default="")
    status = models.CharField(max_length=16, choices=BenchmarkStatus.choices,
                              default=BenchmarkStatus.QUEUED, db_index=True)
    config = models.JSONField(default=dict)
    # Uploaded prompts (JSONL or ShareGPT text); empty for a built-in set.
    prompts_text = models.TextField(blank=True, default="")
    progress = models.JSONField(default=dict, blank=True)
    results = models.JSONField(default=dict, blank=True)
    # Why the run failed; empty for one that measured.
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


Run = TypeVar("Run", bound=BackgroundRun)


def run_claim(model: type[BackgroundRun], run_id: int) -> bool:
    """The task takes a queued run; False when it is not queued (cancelled, or taken)."""
    return bool(model._default_manager.filter(pk=run_id, status=BenchmarkStatus.QUEUED).update(
        status=BenchmarkStatus.RUNNING, started_at=timezone.now()))


def run_request_cancel(run: Run) -> Run:
    """A queued run ends at once; a running one is asked to stop (its task polls)."""
    model = type(run)
    model._default_manager.filter(pk=run.pk, status=BenchmarkStatus.QUEUED).update(
        status=BenchmarkStatus.CANCELLED, finished_at=timezone.now())
    model._default_manager.filter(pk=run.pk, status=BenchmarkStatus.RUNNING).update(
        status=BenchmarkStatus.CANCELLING)
    run.refresh_from_db()
    return run


def run_cancelling(model: type[BackgroundRun], run_id: int) -> bool:
    return model._default_manager.filter(pk=run_id, status=BenchmarkStatus.CANCELLING).exists()


def run_finish(model: type[BackgroundRun], run_id: int, status: str, **fields: Any) -> bool:
    """The run's end, once: only from running or cancelling."""
    return bool(model._default_manager.filter(pk=run_id, status__in=[
        BenchmarkStatus.RUNNING, BenchmarkStatus.CANCELLING]).update(
        status=status, finished_at=timezone.now(), **fields))


def run_polled(model: type[BackgroundRun], run_id: int, work: Callable[[threading.Event], None],
               snapshot: Callable[[], dict[str, Any]], *, name: str) -> None:
    """`work(cancel)` on a thread; every POLL_S the row gets `snapshot()` (when it changed)
    and a cancel asked on the row sets `cancel`. ORM calls stay on this thread."""
    cancel = threading.Event()
    worker = threading.Thread(target=work, args=(cancel,), name=name, daemon=True)
    worker.start()
    written: dict[str, Any] | None = None
    while worker.is_alive():
        worker.join(POLL_S)
        now = snapshot()
        if now != written:
            model._default_manager.filter(pk=run_id).update(progress=now)
            written = now
        if run_cancelling(model, run_id):
            cancel.set()
