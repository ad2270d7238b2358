"""Deployments and their append-only event log.

Status changes only through services/lifecycle.py, which applies appliance.lifecycle's
table as conditional UPDATEs; nothing here assigns status.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import models

from appliance import events, lifecycle
from appliance.runtime import series


class DeploymentStatus(models.TextChoices):
    """appliance.lifecycle.Status as Django's choices (the same names and values)."""

    QUEUED = "queued"
    BUILDING = "building"
    STARTING = "starting"
    CHECKING = "checking"  # the GPU self-check, before the model load
    LOADING = "loading"
    CAPTURING = "capturing"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


# The sets are appliance.lifecycle's (its table says which process moves which status);
# tests/web/test_status_writes.py holds DeploymentStatus to lifecycle.Status.
ACTIVE_STATUSES = frozenset(DeploymentStatus(s) for s in lifecycle.ACTIVE)
TERMINAL_STATUSES = frozenset(DeploymentStatus(s) for s in lifecycle.TERMINAL)
# The engine container may be running in these; the agent watches them.
RUNNING_STATUSES = frozenset(DeploymentStatus(s) for s in lifecycle.RUNNING)


class Deployment(models.Model):
    name = models.SlugField(max_length=63)
    spec = models.JSONField(help_text="The validated deployment spec (appliance.engine.spec).")
    recipe = models.CharField(max_length=200)
    algorithm = models.CharField(max_length=16)
    gpus = models.JSONField(default=list)
    status = models.CharField(
        max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.QUEUED
    )
    phase = models.CharField(max_length=32, blank=True, default="")
    progress = models.JSONField(default=dict, blank=True)
    decode_stats = models.JSONField(default=dict, blank=True)
    # Alerts firing now, by id (appliance.runtime.alerts); each change is also an event.
    alerts = models.JSONField(default=dict, blank=True)
    # When each status was entered (ISO time): the phase durations Prometheus reads.
    status_times = models.JSONField(default=dict, blank=True)
    diagnosis = models.JSONField(null=True, blank=True)
    last_lines = models.JSONField(default=list, blank=True)
    preflight = models.JSONField(default=list, blank=True)
    image = models.CharField(max_length=300, blank=True, default="")
    rebuild_image = models.BooleanField(
        default=False, help_text="Build the image even when one with its content tag exists."
    )
    container_name = models.CharField(max_length=200, blank=True, default="")
    engine_url = models.CharField(max_length=300, blank=True, default="")
    log_cursor = models.CharField(
        max_length=40, blank=True, default="", help_text="Unix time of the last shipped output."
    )
    last_seq = models.PositiveBigIntegerField(default=0)
    # Retention (services/retention.py): log lines up to this seq were sorted into kept and
    # dropped by age already; the next pass starts here.
    log_pruned_seq = models.PositiveBigIntegerField(default=0)
    # Engine identity: a token per start, and the agent (agent@<host>) that stepped this
    # run, set by each host API step of it (web/fleet/hostwrites.py) and cleared when
    # a new run starts: what the silence check judges the row by (that agent's last host
    # report), empty while no agent has taken the run. The host's lease is on its FleetHost.
    start_token = models.CharField(max_length=32, blank=True, default="")
    agent_id = models.CharField(max_length=100, blank=True, default="")
    # The worker building the image (empty: queued for any worker) and its heartbeat.
    build_owner = models.CharField(max_length=100, blank=True, default="")
    build_lease_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Lifecycle (services/lifecycle.py): the current run (each start of the engine is one:
    # the deploy, a Restart, a restart by the spec's policy), how many times the policy has
    # restarted it since the last deploy or Restart, and not before when the next start.
    run = models.PositiveIntegerField(default=1)
    restarts = models.PositiveIntegerField(default=0)
    restart_not_before = models.DateTimeField(null=True, blank=True)
    # The expected weight load per model ("weights", "draft_weights"): bytes, the root's
    # read rate and seconds (services/loadtime.py); the Weights card compares the real one.
    load_estimate = models.JSONField(default=dict, blank=True)
    # The status summary's derived parts, kept current by their writers so that a read is
    # this row alone (selectors.deployment_summary, the API's ETag): the verify-graph widths
    # the spec needs (None: worked out from the spec on read), each alert's latest raise and
    # clear (services.metrics.deployment_apply_alerts), the newest metric point
    # (services.metrics.metrics_store_point).
    graph_needed = models.JSONField(null=True, blank=True)
    alert_history = models.JSONField(default=list, blank=True)
    latest_metrics = models.JSONField(null=True, blank=True)
    # Replicas: a spec with replicas: N is this row (replica 0, the one people see and act
    # on) and N-1 rows with replica_of set to it, each an engine of its own with its own
    # runs, events and metrics, behind the gateway's one served name.
    replica_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="replica_rows")
    replica_index = models.PositiveSmallIntegerField(default=0)
    # Where this row's engine runs and its GPUs are leased (web/fleet/placement.py chose
    # it, in the transaction that made the row), and why: the row's own reads show it. A
    # joined host's choice is also a fleet Placement (the host's write scope); empty on
    # rows made before placement: the panel's own host (APPLIANCE_HOST_NAME).
    host = models.CharField(max_length=100, blank=True, default="")
    placement_reason = models.CharField(max_length=300, blank=True, default="")
    # Out of the gateway's rotation for new requests (a rolling change drains a replica
    # before it stops it; in-flight requests finish: web/deployments/inflight.py counts them).
    draining = models.BooleanField(default=False)
    # Replica 0's alone: the rolling change under way or the last one (kind, its replicas in
    # order, the one whose turn it is and its step, a halt's cause): services/rolling.py
    # writes it, the panel loop (web/loop.py) moves it on, the page and the API show it.
    rolling = models.JSONField(default=dict, blank=True)
    # Replica 0's alone: the Tune that holds the deployment now (its id, what it holds, since
    # and until when), written when the Tune takes it and emptied when it gives it back
    # (web/benchmarks/tune_task.py); the page and the detail API show it with the row.
    tune_hold = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status"]), models.Index(fields=["name"])]
        constraints = [
            models.UniqueConstraint(fields=["replica_of", "replica_index"],
                                    condition=models.Q(replica_of__isnull=False),
                                    name="deployment_replica_once"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def engine_options(self) -> dict[str, Any]:
        engine = self.spec.get("engine", {})
        return engine if isinstance(engine, dict) else {}


class EventKind(models.TextChoices):
    """An Event row's kind; what each carries is appliance.events'."""

    LOG = events.LOG
    PHASE = events.PHASE
    PROGRESS = events.PROGRESS
    METRIC = events.METRIC
    DIAGNOSIS = events.DIAGNOSIS
    BUILD = events.BUILD
    SELFCHECK = events.SELFCHECK
    STATUS = events.STATUS
    PREFLIGHT = events.PREFLIGHT
    ALERT = events.ALERT
    END = events.END


# What the detail page's log shows as lines (log lines, and markers for the others).
LINE_KINDS = (EventKind.LOG, EventKind.BUILD, EventKind.PHASE, EventKind.STATUS,
              EventKind.DIAGNOSIS, EventKind.ALERT)
# The rare kinds (everything but log lines, stats and progress): a partial index serves a
# filter on them, and retention never drops them (docs/events-retention.md).
NOTABLE_KINDS = frozenset({EventKind.PHASE, EventKind.STATUS, EventKind.DIAGNOSIS,
                           EventKind.ALERT, EventKind.BUILD, EventKind.SELFCHECK,
                           EventKind.PREFLIGHT, EventKind.END})


class Event(models.Model):
    """One thing that happened to a deployment; seq is gap-free per deployment."""

    # No database foreign key and no index of its own: the constraint's check per
    # row was 40 % of PostgreSQL's COPY of a busy engine's events, and (deployment, seq) below
    # already indexes deployment first. Integrity is kept by the only paths that write and
    # delete: an append claims its seqs by updating the deployment's row in its transaction
    # (services/events.py; no row, nothing written), and deployment_delete locks that row
    # before deleting, so no event of a deleted deployment can commit after it.
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events",
                                   db_constraint=False, db_index=False)
    seq = models.PositiveBigIntegerField()
    ts = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["deployment", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "seq"], name="event_seq_unique"),
        ]
        # (deployment, seq) pages the log (the constraint's index); this one finds the rare
        # kinds among a million log lines, and costs a write only for those rare rows.
        indexes = [models.Index(fields=["deployment", "seq"], name="event_notable",
                                condition=models.Q(kind__in=sorted(NOTABLE_KINDS)))]

    def __str__(self) -> str:
        return f"{self.deployment_id}#{self.seq} {self.kind}"

    def to_wire(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts.isoformat(),
            "kind": self.kind,
            "payload": self.payload,
        }


class StatusBody(models.Model):
    """The status reads' answers (the API's detail and summary JSON) as rendered from one
    version of the deployment's row, stored by the row's writers (services/reads.py) so a
    token read returns these bytes instead of serializing the row. They are
    served only while `version` is the row's current one (PostgreSQL's xmin, the ETag's):
    any other write makes them unused, never wrong."""

    deployment = models.OneToOneField(Deployment, primary_key=True, on_delete=models.CASCADE,
                                      related_name="+")
    version = models.CharField(max_length=20)  # the row's xmin::text they were rendered at
    detail = models.BinaryField()
    summary = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.deployment_id} at {self.version}"


class Run(models.Model):
    """One start of a deployment's engine; its events are those from first_seq up to the next
    run's first_seq. Run 1 is written when a second run begins (services/lifecycle.py)."""

    class Reason(models.TextChoices):
        DEPLOY = "deploy"
        RESTART = "restart"  # a person pressed Restart (panel or API)
        POLICY = "policy"  # the spec's restart policy, after the engine died while serving

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="runs")
    number = models.PositiveIntegerField()
    reason = models.CharField(max_length=16, choices=Reason.choices)
    first_seq = models.PositiveBigIntegerField()
    started_at = models.DateTimeField()
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # How it ended (the deployment's status then) and the diagnosis, once a later run began.
    outcome = models.CharField(max_length=16, blank=True, default="")
    diagnosis = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["deployment", "number"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="run_number_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id} run {self.number}"


class Installation(models.Model):
    """This install's identity, made once: engine containers carry its id."""

    instance_id = models.CharField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.instance_id


class MetricPoint(models.Model):
    """One point of a deployment's metric series (appliance.runtime.series.MetricPoint).

    Points come at the scrape interval (resolution_s 2 by default); older ones are merged
    into one per minute (resolution_s 60) and dropped after the retention. Live points
    reach browsers over the live channel only, never as events.
    """

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="metric_points")
    ts = models.DateTimeField()
    resolution_s = models.PositiveSmallIntegerField()
    throughput = models.FloatField(null=True)
    input_throughput = models.FloatField(null=True)
    accept_len = models.FloatField(null=True)
    accept_rate = models.FloatField(null=True)
    running = models.FloatField(null=True)
    queued = models.FloatField(null=True)
    kv_usage = models.FloatField(null=True)
    cache_hit_rate = models.FloatField(null=True)
    cuda_graph = models.FloatField(null=True)
    ttft_p50 = models.FloatField(null=True)
    ttft_p90 = models.FloatField(null=True)
    ttft_p99 = models.FloatField(null=True)
    itl_p50 = models.FloatField(null=True)
    itl_p90 = models.FloatField(null=True)
    itl_p99 = models.FloatField(null=True)
    e2e_p50 = models.FloatField(null=True)
    e2e_p90 = models.FloatField(null=True)
    e2e_p99 = models.FloatField(null=True)
    # Per GPU of the deployment: [utilisation %, memory used GB, memory total GB].
    gpus = models.JSONField(default=list, blank=True)

    class Meta:
        indexes = [models.Index(fields=["deployment", "ts"], name="metricpoint_deployment_ts")]

    def __str__(self) -> str:
        return f"{self.deployment_id}@{self.ts.isoformat()}"

    def to_point(self) -> series.MetricPoint:
        return series.MetricPoint(t=self.ts.timestamp(), gpus=self.gpus or [],
                                  **{name: getattr(self, name) for name in series.SCALARS})

    @classmethod
    def of(cls, deployment_id: int, point: series.MetricPoint, resolution_s: int) -> MetricPoint:
        gpus = [[None if v is None else round(v, 2) for v in row] for row in point.gpus]
        return cls(deployment_id=deployment_id, resolution_s=resolution_s, gpus=gpus,
                   ts=datetime.fromtimestamp(point.t, tz=UTC),
                   **{name: getattr(point, name) for name in series.SCALARS})


class RootReadRate(models.Model):
    """A model root's sequential read rate, page cache bypassed (appliance.store.diskrate):
    what a model's expected load time is worked out from. The latest measurement per root."""

    root = models.CharField(max_length=500, unique=True)
    gbps = models.FloatField()
    bytes_read = models.BigIntegerField()
    seconds = models.FloatField()
    method = models.CharField(max_length=20)
    note = models.TextField(blank=True, default="")
    measured_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.root}: {self.gbps:.2f} GB/s"
