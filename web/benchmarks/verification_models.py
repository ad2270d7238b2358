"""A losslessness check: a speculative deployment (the candidate, A) against a baseline of
the same target model without speculation (B), the same prompts at temperature 0; per
prompt where A's tokens first part from B's and B's top-2 log-prob gap there."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .runs import BackgroundRun


class VerificationRun(BackgroundRun):
    # config: max_tokens, threshold, prompt_source (builtin | jsonl); prompts_text: the
    # uploaded JSONL of prompts, empty for the built-in set.
    candidate = models.ForeignKey("deployments.Deployment", null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="+")
    baseline = models.ForeignKey("deployments.Deployment", null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="+")
    # Taken at creation, kept when a deployment is deleted: {"candidate": {...},
    # "baseline": {...}} with id, name, model, algorithm, image, engine_url.
    targets = models.JSONField(default=dict)
    # progress: done, total, identical, ...; results:
    # appliance.bench.verify.VerifyResult.to_dict(): per prompt and the totals.
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta(BackgroundRun.Meta):
        pass

    def __str__(self) -> str:
        return f"losslessness check #{self.pk} ({self.status})"
