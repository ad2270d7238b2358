"""Reads: runs, the deployments a benchmark can aim at, and the CSV export."""

from __future__ import annotations

import csv
import io

from django.db.models import Count, Q, QuerySet

from web.deployments.models import TERMINAL_STATUSES, Deployment, DeploymentStatus

from .models import BenchmarkRun

CSV_COLUMNS = ("target", "concurrency", "completed", "errors", "duration_s",
               "request_throughput", "output_throughput", "accept_len", "request_accept_len",
               "token_source")
STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def benchmark_list() -> QuerySet[BenchmarkRun]:
    return BenchmarkRun.objects.order_by("-created_at")


def ready_deployments() -> QuerySet[Deployment]:
    """The ready deployments a run can aim at, each once: replica 0, the row people act on,
    with `replica_count` its running engines (its replica rows are chosen through it)."""
    running = ~Q(replica_rows__status__in=list(TERMINAL_STATUSES))
    return (Deployment.objects.filter(status=DeploymentStatus.READY, replica_of=None)
            .exclude(engine_url="")
            .annotate(replica_count=Count("replica_rows", filter=running) + 1)
            .order_by("-created_at"))


def benchmark_csv(*, run: BenchmarkRun) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    stat_cols = [f"{s}_{k}" for s in STATS for k in ("mean", "p50", "p90", "p99")]
    writer.writerow([*CSV_COLUMNS, *stat_cols, "throughput_ratio", "tpot_ratio"])
    ratios = {(r["target"], r["concurrency"]): r
              for r in (run.results or {}).get("speedups", [])}
    for level in (run.results or {}).get("levels", []):
        ratio = ratios.get((level["target"], level["concurrency"]), {})
        writer.writerow([*(level.get(c) for c in CSV_COLUMNS),
                         *(level[s][k] for s in STATS for k in ("mean", "p50", "p90", "p99")),
                         ratio.get("throughput_ratio"), ratio.get("tpot_ratio")])
    return out.getvalue()
