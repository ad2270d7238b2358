"""API keys for the OpenAI-compatible gateway, and what each key used per deployment."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from web.deployments.models import Deployment


class ApiKey(models.Model):
    """A key is `sk-sd-<prefix><rest>`; only its SHA-256 is kept, the secret is shown once.

    The prefix (the first characters after `sk-sd-`) names the key in lists and logs without
    revealing it; the digest finds it on each request.
    """

    name = models.CharField(max_length=100)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="api_keys")
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    # False: only the deployments listed in `deployments` may be called with it.
    all_deployments = models.BooleanField(default=True)
    deployments = models.ManyToManyField(Deployment, blank=True, related_name="+")
    # Requests per minute (a fixed one-minute window in Redis); None: no limit.
    rate_limit_per_minute = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (sk-sd-{self.prefix}...)"


class ApiKeyUsage(models.Model):
    """Counted from the engine's own usage, per key and deployment. key None: a logged-in
    operator's calls (the playground), counted per user."""

    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.CASCADE, related_name="+")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+")
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["key", "deployment"], name="apikey_usage_unique",
                                    condition=models.Q(key__isnull=False)),
            models.UniqueConstraint(fields=["user", "deployment"],
                                    name="apikey_usage_session_unique",
                                    condition=models.Q(key__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.key_id or 'session'}@{self.deployment_id}: {self.requests}"
