"""The fleet: GPU hosts that joined the panel, the tokens they joined with, and which
deployment runs where.

Secrets are never stored: a join token and a host's credential are kept as their SHA-256
(a 256-bit random secret needs no slow hash) with a short prefix that names them in lists.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

from web.deployments.models import Deployment


class JoinToken(models.Model):
    """What an admin gives one GPU host so that it can join: `sdj-<prefix><secret>`.

    It joins only the host it names, until it expires or is revoked; a second use by that
    host (its agent's stored credential lost) gives it a new credential and ends the old.
    """

    host_name = models.SlugField(max_length=63, help_text="The host this token may join.")
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Who used it (the host's name as it joined) and when, first and last.
    used_by = models.CharField(max_length=63, blank=True, default="")
    first_used_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"sdj-{self.prefix}... for {self.host_name}"


# A credential digest or prefix that starts with this opens nothing: SHA-256 hex digests
# and the hex prefixes of made credentials never contain it. A host row that has not joined
# (the panel's own host before its agent joins) holds one, random after the mark so that
# each row's stays unique; a join with a token replaces it.
UNJOINED_MARK = "-"


def unjoined_credential() -> dict[str, str]:
    """The credential fields of a host row that has not joined: nothing hashes to them."""
    return {"credential_prefix": UNJOINED_MARK + secrets.token_hex(7),
            "credential_digest": UNJOINED_MARK + secrets.token_hex(31)}


class FleetHostQuerySet(models.QuerySet["FleetHost"]):
    def joined(self) -> FleetHostQuerySet:
        """The hosts that joined with a token (a credential that opens the host API)."""
        return self.exclude(credential_digest__startswith=UNJOINED_MARK)

    def unjoined(self) -> FleetHostQuerySet:
        """The hosts whose agent reports without the host API: the panel's own."""
        return self.filter(credential_digest__startswith=UNJOINED_MARK)


class FleetHost(models.Model):
    """A GPU host and its agent's report: Docker, GPUs, secret names, strays, heartbeat.

    A joined host came with a token and holds the credential its agent uses; the panel's
    own host (APPLIANCE_HOST_NAME) has a row before its agent joins (with the token the
    panel loop keeps for it), with a credential no secret opens (`unjoined_credential`):
    until then its rows' Placements open no host API write. Its name is the one its GPU
    leases carry (GpuLease.host). Removing a joined host deletes this row, so its
    credential is refused from then on.
    """

    name = models.SlugField(max_length=63, unique=True)
    credential_prefix = models.CharField(max_length=16, unique=True)
    credential_digest = models.CharField(max_length=64, unique=True)
    credential_made_at = models.DateTimeField()
    credential_last_used_at = models.DateTimeField(null=True, blank=True)
    joined_at = models.DateTimeField(auto_now_add=True)
    joined_with = models.ForeignKey(JoinToken, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    agent_version = models.CharField(max_length=64, blank=True, default="")
    # Each GPU: index, name, memory_total_gb, uuid where NVML gave them; `gpu_source` says
    # whether NVML listed them or the host stated a count (APPLIANCE_GPU_COUNT).
    gpus = models.JSONField(default=list, blank=True)
    gpu_source = models.CharField(max_length=16, blank=True, default="")
    # Docker's facts: server version, runtimes, CDI devices, whether NVIDIA's runtime is there.
    docker = models.JSONField(default=dict, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Drained: the placement puts no new engine here; the engines it runs go on.
    draining = models.BooleanField(default=False)
    drained_at = models.DateTimeField(null=True, blank=True)
    # The agent process that writes for this host: its session (sent with each call) and
    # until when it holds the host. Claimed by the placements read, renewed once a third of
    # it is spent; another session's writes are refused until it has run out.
    agent_session = models.CharField(max_length=64, blank=True, default="")
    agent_lease_until = models.DateTimeField(null=True, blank=True)
    # The report: the agent that sends it (agent@<host>), the last NVML snapshot
    # (appliance.runtime.gpu_telemetry: available, reason, gpus), the engine secret store's
    # names (never values, for pre-flight) and containers with the appliance's labels that
    # no deployment of this install owns (strays).
    agent_id = models.CharField(max_length=100, blank=True, default="")
    gpu_telemetry = models.JSONField(default=dict, blank=True)
    secret_names = models.JSONField(default=list, blank=True)
    foreign_containers = models.JSONField(default=list, blank=True)

    objects = FleetHostQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_joined(self) -> bool:
        return not self.credential_digest.startswith(UNJOINED_MARK)


class Placement(models.Model):
    """A deployment's engine (one replica of it) placed on a host: what the host may write.

    The ingest lets a host store events only for the deployments placed on it; a
    replica's number leaves room for a deployment with several engines on several hosts.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE,
                                   related_name="placements")
    replica = models.PositiveSmallIntegerField(default=0)
    host = models.ForeignKey(FleetHost, on_delete=models.PROTECT, related_name="placements")
    reason = models.CharField(max_length=300, blank=True, default="")
    placed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["deployment", "replica"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "replica"],
                                    name="placement_replica_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}/{self.replica} on {self.host_id}"


class GpuLease(models.Model):
    """One GPU of one host held by a deployment from its creation until it ends.

    The unique constraint is the lock: two requests racing for a GPU both INSERT and the
    database lets one through. Rows are deleted when the deployment reaches a terminal
    status (leases.py, through the hook web/deployments/services/gpus.py calls), so a held
    row always means a live holder. Its host is a name, the panel's own host's included
    (APPLIANCE_HOST_NAME). The table keeps the name it had
    under web/deployments.
    """

    host = models.CharField(max_length=100)
    gpu_index = models.PositiveSmallIntegerField()
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="gpu_leases")
    acquired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "deployments_gpulease"
        ordering = ["host", "gpu_index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "gpu_index"], name="gpulease_host_gpu_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.host} GPU {self.gpu_index} -> {self.deployment_id}"
