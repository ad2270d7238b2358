"""The statuses of a benchmark run and of a losslessness check (both runs share them), apart
from the models so that each run's module imports them without importing the other."""

from __future__ import annotations

from django.db import models


class BenchmarkStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    DONE = "done"
    FAILED = "failed"


ACTIVE_STATUSES = frozenset({BenchmarkStatus.QUEUED, BenchmarkStatus.RUNNING,
                             BenchmarkStatus.CANCELLING})
TERMINAL_STATUSES = frozenset({BenchmarkStatus.CANCELLED, BenchmarkStatus.DONE,
                               BenchmarkStatus.FAILED})
