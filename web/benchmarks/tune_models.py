"""A Tune: candidate variants of one deployment's spec (no speculation, DFLASH, DDTREE
budgets, the operator's) run one after another on its own GPUs, each checked lossless
against the baseline and benchmarked at the operator's concurrencies; the recommendation per
concurrency range; the deployment restored as it was; Apply redeploys the winner."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .runs import BackgroundRun


class TuneRun(BackgroundRun):
    # levels, num_prompts, input_len, output_len, prompt_source, warmup, seed,
    # time_budget_s, deploy_timeout_s, lossless_prompts, lossless_max_tokens, threshold,
    # candidates (each {"name", "engine", "algorithm"})
    deployment = models.ForeignKey("deployments.Deployment", null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="tunes")
    # The deployment as it was when the Tune began (id, name, spec, gpus, status, image,
    # served_model): what the restore puts back, kept when the deployment is deleted.
    original = models.JSONField(default=dict, blank=True)
    # Apply: {"candidate", "state" (queued, running, rolling, done, failed), "message", "at"}.
    applied = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta(BackgroundRun.Meta):
        pass

    def __str__(self) -> str:
        return f"tune #{self.pk} ({self.status})"
