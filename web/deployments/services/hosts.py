"""What the GPU host can do (Docker's GPU support).

The engine agent reports Docker's facts in a Host row; pre-flight reads them, so a
deployment that asks for GPUs on a host whose Docker has no NVIDIA runtime is refused
before anything starts, with a fix that fits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from appliance.logs.appliance_causes import NO_NVIDIA_FIX
from appliance.preflight import Finding
from appliance.runtime.secrets import secret_names_available

from ..models import Host

HOST_FRESH_S = 120  # a report older than this says nothing about the host now
def host_gpu_findings(*, gpus: list[int], gpu_requests: bool) -> list[Finding]:
    """Pre-flight from the agents' reports: GPUs asked for on a host Docker can't give them."""
    if not (gpu_requests and gpus):
        return []
    fresh = timezone.now() - timedelta(seconds=HOST_FRESH_S)
    hosts = list(Host.objects.filter(heartbeat_at__gte=fresh))
    if not hosts or any(h.docker.get("nvidia") for h in hosts):
        return []
    names = ", ".join(h.name for h in hosts)
    return [Finding(
        rule="host-gpu-runtime", severity="error", field="gpus",
        message=f"this host's Docker has no NVIDIA runtime ({names}: runtimes "
                f"{', '.join(hosts[0].docker.get('runtimes') or []) or 'none'}), so the "
                "engine cannot be given GPUs.",
        fix=NO_NVIDIA_FIX)]


def host_gpu_inventory() -> list[dict[str, Any]] | None:
    """The GPUs the freshest agent reports through NVML (name, index, compute capability
    where known), for the pre-flight rules that depend on the GPU architecture; None when no
    fresh agent has NVML."""
    fresh = timezone.now() - timedelta(seconds=HOST_FRESH_S)
    hosts = [h for h in Host.objects.filter(heartbeat_at__gte=fresh).order_by("-heartbeat_at")
             if (h.gpu_telemetry or {}).get("available") and h.gpu_telemetry.get("gpus")]
    return [dict(g) for g in hosts[0].gpu_telemetry["gpus"]] if hosts else None


def host_gpu_count(*, configured: int) -> tuple[int, str]:
    """How many GPUs the host has, and who says so: the agents' NVML inventory (the largest
    fresh one), else the configured count (APPLIANCE_GPU_COUNT). Never unknown: an
    unbounded GPU id would lease a GPU that does not exist."""
    fresh = timezone.now() - timedelta(seconds=HOST_FRESH_S)
    counts = [(len(h.gpu_telemetry.get("gpus") or []), h.name)
              for h in Host.objects.filter(heartbeat_at__gte=fresh)
              if (h.gpu_telemetry or {}).get("available")]
    if counts:
        count, name = max(counts)
        return count, f"NVML on {name}"
    # Without NVML, joined hosts state a count (their heartbeat's report row): the largest
    # host bounds a GPU id, the panel's own (APPLIANCE_GPU_COUNT, 0 on a panel without GPUs)
    # among them; placement then checks each host's own.
    stated = [(len(h.gpu_telemetry.get("gpus") or []), h.name)
              for h in Host.objects.filter(heartbeat_at__gte=fresh)
              if isinstance(h.gpu_telemetry, dict) and not h.gpu_telemetry.get("available")]
    count, name = max(stated, default=(0, ""))
    if count > configured:
        return count, f"the count {name} states"
    return configured, "APPLIANCE_GPU_COUNT"


def host_gpu_inventory_findings(*, gpus: list[int], configured: int) -> list[Finding]:
    """Pre-flight: GPU ids the host does not have."""
    count, source = host_gpu_count(configured=configured)
    missing = [g for g in gpus if g >= count]
    if not missing:
        return []
    have = f"ids 0 to {count - 1}" if count else "none"
    return [Finding(
        rule="host-gpu-inventory", severity="error", field="gpus",
        message=f"GPU ids {missing} are not on this host: it has {count} GPUs ({have}, "
                f"per {source}).",
        fix=f"list GPU ids from 0 to {count - 1} under gpus" if count else
            "run the deployment on a host with GPUs")]


def host_secret_names(*, directory: str) -> frozenset[str]:
    """Secret names the engine secret store holds: what the fresh agents report (they read
    the store), else what this process sees of it (a host install, the tests)."""
    fresh = timezone.now() - timedelta(seconds=HOST_FRESH_S)
    reports = list(Host.objects.filter(heartbeat_at__gte=fresh).values_list(
        "secret_names", flat=True))
    if reports:
        return frozenset(name for names in reports for name in names or [])
    return frozenset(secret_names_available(directory=directory))
