"""Apply the event log's retention now (the engine agent also runs it every few minutes):
stats lines folded into the metric series, old log lines dropped, what a diagnosis needs kept
(docs/events-retention.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from web.deployments.services.retention import events_prune


class Command(BaseCommand):
    help = "Fold old stats lines into the metric series and drop log lines past the retention."

    def handle(self, *args: Any, **options: Any) -> None:
        report = events_prune()
        self.stdout.write(
            f"event retention: {report.stats_deleted} stats rows folded and removed "
            f"({report.folded_points} new series points), {report.lines_deleted} log lines "
            "past the retention removed")
