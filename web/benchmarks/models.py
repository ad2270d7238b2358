"""A benchmark run: one or more ready deployments (A/B), the same prompts and levels each."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .choices import ACTIVE_STATUSES, TERMINAL_STATUSES, BenchmarkStatus

# The losslessness check's run lives in its own module; imported here so Django finds it.
from .verification_models import VerificationRun


class BenchmarkRun(models.Model):
    name = models.CharField(max_length=100, blank=True, default="")
    status = models.CharField(max_length=16, choices=BenchmarkStatus.choices,
                              default=BenchmarkStatus.QUEUED, db_index=True)
    # levels, num_prompts, input_len, output_len, prompt_source, mode, warmup, seed,
    # request_rate, baseline (a target name)
    config = models.JSONField(default=dict)
    # Uploaded prompts (JSONL or ShareGPT text), empty for the synthetic set.
    prompts_text = models.TextField(blank=True, default="")
    # Per deployment, taken at creation: id, name, spec, image, engine_url, algorithm.
    targets = models.JSONField(default=list)
    deployments = models.ManyToManyField("deployments.Deployment", related_name="benchmarks")
    progress = models.JSONField(default=dict, blank=True)
    results = models.JSONField(default=dict, blank=True)
    # Why the run failed: a target nobody answers at, the first request error when every
    # request failed, or an unexpected exception's traceback. Empty for a run that measured.
    error = models.TextField(blank=True, default="")
    # Requests that failed over the whole run (per level: results.levels[].errors).
    failed_requests = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"benchmark #{self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


# The statuses are choices.py's; named here too, where the models' readers look for them.
__all__ = ["ACTIVE_STATUSES", "TERMINAL_STATUSES", "BenchmarkRun", "BenchmarkStatus",
           "VerificationRun"]
