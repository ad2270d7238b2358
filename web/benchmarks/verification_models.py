"""A losslessness check: a speculative deployment (the candidate, A) against a baseline of
the same target model without speculation (B), the same prompts at temperature 0; per
prompt where A's tokens first part from B's and B's top-2 log-prob gap there."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .choices import ACTIVE_STATUSES, BenchmarkStatus


class VerificationRun(models.Model):
    name = models.CharField(max_length=100, blank=True, default="")
    # The same states as a benchmark run (queued, running, cancelling, ... done, failed).
    status = models.CharField(max_length=16, choices=BenchmarkStatus.choices,
                              default=BenchmarkStatus.QUEUED, db_index=True)
    # max_tokens, threshold, prompt_source (builtin | jsonl)
    config = models.JSONField(default=dict)
    # The uploaded JSONL of prompts; empty for the built-in set.
    prompts_text = models.TextField(blank=True, default="")
    candidate = models.ForeignKey("deployments.Deployment", null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="+")
    baseline = models.ForeignKey("deployments.Deployment", null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="+")
    # Taken at creation, kept when a deployment is deleted: {"candidate": {...},
    # "baseline": {...}} with id, name, model, algorithm, image, engine_url.
    targets = models.JSONField(default=dict)
    progress = models.JSONField(default=dict, blank=True)  # done, total, identical, ...
    # appliance.bench.verify.VerifyResult.to_dict(): per prompt and the totals.
    results = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"losslessness check #{self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES
