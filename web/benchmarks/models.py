"""A benchmark run: one or more ready deployments (A/B), the same prompts and levels each."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .choices import ACTIVE_STATUSES, TERMINAL_STATUSES, BenchmarkStatus
from .runs import BackgroundRun

# The losslessness check's run and Tune's live in their own modules; imported here so
# Django finds them.
from .tune_models import TuneRun
from .verification_models import VerificationRun


class BenchmarkRun(BackgroundRun):
    # config: levels, num_prompts, input_len, output_len, prompt_source, mode, warmup, seed,
    # request_rate, baseline (a target name)
    # Per deployment, taken at creation: id, name, spec, image, engine_url, algorithm.
    targets = models.JSONField(default=list)
    deployments = models.ManyToManyField("deployments.Deployment", related_name="benchmarks")
    # error: a target nobody answers at, the first request error when every request failed,
    # or an unexpected exception's traceback.
    # Requests that failed over the whole run (per level: results.levels[].errors).
    failed_requests = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL)

    class Meta(BackgroundRun.Meta):
        pass

    def __str__(self) -> str:
        return f"benchmark #{self.pk} ({self.status})"


# The statuses are choices.py's; named here too, where the models' readers look for them.
__all__ = ["ACTIVE_STATUSES", "TERMINAL_STATUSES", "BenchmarkRun", "BenchmarkStatus",
           "TuneRun", "VerificationRun"]
