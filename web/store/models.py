"""The model store's record: one entry per model folder in a root, one row per file.

An entry is usable (mountable into an engine) only in state READY, which a download reaches
only after every file's size and, where the hub gave one, its sha256 were checked. States
change only through web.store.services, each a conditional UPDATE where two may race.
"""

from __future__ import annotations

from django.db import models

from appliance.preflight import MODELS_MOUNT


class ModelState(models.TextChoices):
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    PARTIAL = "partial"  # files missing or short: stopped mid-way, or a local copy cut short
    FAILED = "failed"  # a checksum or size mismatch, or an error the download cannot pass
    CANCELLED = "cancelled"


# A download job may be working on these; the others are where it ends.
ACTIVE_STATES = frozenset({ModelState.DOWNLOADING, ModelState.VERIFYING})
TERMINAL_STATES = frozenset({ModelState.READY, ModelState.PARTIAL, ModelState.FAILED,
                             ModelState.CANCELLED})


class ModelKind(models.TextChoices):
    TARGET = "target"
    DRAFTER = "drafter"  # a DFlash block drafter (config carries dflash_config / block_size)


class ModelSource(models.TextChoices):
    HUB = "hub"  # downloaded by the store from a Hugging Face hub
    LOCAL = "local"  # found in a root by a scan (copied there by hand)


class ModelEntry(models.Model):
    root = models.CharField(max_length=500, help_text="The model root as this host sees it.")
    relative_path = models.CharField(
        max_length=500, help_text="The model folder below the root; engines see "
        "/models/<relative_path>.")
    source = models.CharField(max_length=8, choices=ModelSource.choices,
                              default=ModelSource.LOCAL)
    repo_id = models.CharField(max_length=200, blank=True, default="")
    revision = models.CharField(max_length=200, blank=True, default="",
                                help_text="The revision asked for (branch, tag or commit).")
    commit = models.CharField(max_length=64, blank=True, default="",
                              help_text="The commit the revision resolved to.")
    size_bytes = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    file_count = models.IntegerField(default=0)
    kind = models.CharField(max_length=8, choices=ModelKind.choices, default=ModelKind.TARGET)
    config = models.JSONField(default=dict, blank=True,
                              help_text="Key config.json values (appliance.store.config).")
    state = models.CharField(max_length=12, choices=ModelState.choices,
                             default=ModelState.DOWNLOADING)
    error = models.TextField(blank=True, default="")
    # Bytes per second over the last progress window, while downloading.
    rate_bps = models.FloatField(default=0.0)
    cancel_requested = models.BooleanField(default=False)
    # The download job working on it: a job takes the entry only when the lease is free or
    # ran out, so a second job (a redelivered message, a restarted worker) never writes
    # beside it; a killed worker's lease runs out and the next job resumes.
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["relative_path", "root"]
        constraints = [models.UniqueConstraint(fields=["root", "relative_path"],
                                               name="store_entry_unique_folder")]

    def __str__(self) -> str:
        return f"{self.relative_path} ({self.state})"

    @property
    def engine_path(self) -> str:
        """Where an engine sees this folder (every root is mounted at /models)."""
        return f"{MODELS_MOUNT}/{self.relative_path}"

    @property
    def is_usable(self) -> bool:
        """Only a verified entry may be mounted into an engine."""
        return self.state == ModelState.READY

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


class FileState(models.TextChoices):
    PENDING = "pending"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    FAILED = "failed"


class ModelFile(models.Model):
    entry = models.ForeignKey(ModelEntry, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=500, help_text="Below the entry's folder.")
    size_bytes = models.BigIntegerField(default=0)
    sha256_expected = models.CharField(max_length=64, blank=True, default="",
                                       help_text="The hub's LFS sha256 (none for small files).")
    sha256_actual = models.CharField(max_length=64, blank=True, default="")
    bytes_done = models.BigIntegerField(default=0)
    state = models.CharField(max_length=12, choices=FileState.choices,
                             default=FileState.PENDING)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["entry", "path"],
                                               name="store_file_unique_path")]

    def __str__(self) -> str:
        return f"{self.path} ({self.state})"
