"""The metric series endpoint's query and answer (GET /api/deployments/<id>/metrics/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

DEFAULT_RANGE = timedelta(minutes=15)
MAX_POINTS = 11_000  # as Prometheus' query_range

PARAMETERS = [
    OpenApiParameter("start", str, description="Range start: Unix seconds or ISO 8601 "
                     "(default: 15 minutes before end)."),
    OpenApiParameter("end", str, description="Range end: Unix seconds or ISO 8601 "
                     "(default: now)."),
    OpenApiParameter("step", float, description="Seconds per point: each is the mean of its "
                     "bucket. Without it, points as stored: every scrape (2 s) for the last "
                     "hour, one per minute before that."),
]


def _value(unit: str) -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text=f"In {unit}; null when unknown.")


class MetricPointSerializer(serializers.Serializer[dict[str, Any]]):
    """One point; its fields are appliance.runtime.series.UNITS (the test keeps them equal)."""

    t = serializers.FloatField(help_text="Unix seconds (a bucket's start with step).")
    throughput = _value("output tokens per second")
    input_throughput = _value("prompt tokens per second")
    accept_len = _value("accepted tokens per verify step")
    accept_rate = _value("ratio 0-1")
    running = _value("requests")
    queued = _value("requests")
    kv_usage = _value("ratio 0-1")
    cache_hit_rate = _value("ratio 0-1")
    cuda_graph = _value("share of decode passes on CUDA graphs, 0-1 (null without passes)")
    ttft_p50 = _value("s")
    ttft_p90 = _value("s")
    ttft_p99 = _value("s")
    itl_p50 = _value("s")
    itl_p90 = _value("s")
    itl_p99 = _value("s")
    e2e_p50 = _value("s")
    e2e_p90 = _value("s")
    e2e_p99 = _value("s")
    gpus = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="Per GPU of the deployment: [utilisation %, memory used GB, memory total "
                  "GB]; empty without NVML on the host.")


class MetricSeriesSerializer(serializers.Serializer[dict[str, Any]]):
    deployment = serializers.IntegerField()
    start = serializers.FloatField(help_text="Unix seconds.")
    end = serializers.FloatField(help_text="Unix seconds.")
    step = serializers.FloatField(allow_null=True)
    units = serializers.DictField(child=serializers.CharField())
    points = MetricPointSerializer(many=True)


def _when(request: Request, name: str, default: datetime) -> datetime:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    parsed = parse_datetime(raw)
    if parsed is None:
        raise ValidationError({name: ["Use Unix seconds or ISO 8601, e.g. 2026-11-30T12:00:00Z."]})
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def series_query(request: Request) -> tuple[datetime, datetime, float | None]:
    """start, end and step from the query string, checked."""
    end = _when(request, "end", timezone.now())
    start = _when(request, "start", end - DEFAULT_RANGE)
    if start >= end:
        raise ValidationError({"start": ["must be before end"]})
    raw = request.query_params.get("step")
    step = None
    if raw:
        try:
            step = float(raw)
        except ValueError:
            raise ValidationError({"step": [f"must be a number of seconds, got {raw!r}"]}) from None
        if not step >= 1:
            raise ValidationError({"step": ["must be at least 1 second"]})
        if (end - start).total_seconds() / step > MAX_POINTS:
            raise ValidationError({"step": [f"gives over {MAX_POINTS} points; raise it or "
                                            "narrow the range"]})
    return start, end, step
