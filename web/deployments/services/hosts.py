"""What one GPU host can do, as pre-flight checks a spec against it: Docker's GPU support,
its GPUs and NVIDIA driver, its secret store's names.

Each host's agent reports these with its join and its heartbeats (web/fleet/services.py);
services/hostreports.py reads them from the host rows. Placement
chooses the host first; web/fleet/hostfacts.py picks that host's rows and `preflight_host`
reads them, so a spec is refused for what the host it will run on lacks (no NVIDIA
runtime, a GPU id it does not have, a secret its store lacks), never for another host's
report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from appliance.logs.appliance_causes import NO_NVIDIA_FIX
from appliance.preflight import Finding
from appliance.runtime.secrets import secret_names_available
from appliance.selfcheck.inventory import check_driver

from .hostreports import HostReport

HOST_FRESH_S = 120  # a report older than this says nothing about the host now


@dataclass(frozen=True)
class PreflightHost:
    """One host's facts as pre-flight reads them; None where no fresh report says."""

    name: str
    reports: tuple[str, ...]  # the report rows (host names) these facts come from
    nvidia: bool | None  # whether its Docker has NVIDIA's runtime
    runtimes: tuple[str, ...]
    gpu_requests: bool  # whether engines there are given GPUs at all (the simulator: no)
    gpus: list[dict[str, Any]] | None  # NVML's inventory (name, index, compute capability)
    gpu_count: int | None  # how many GPUs it has, and who says so (gpu_source)
    gpu_source: str
    secret_names: frozenset[str] | None
    driver_version: str | None = None  # NVML's NVIDIA driver version


def preflight_host(*, name: str, reports: Sequence[HostReport], own: bool) -> PreflightHost:
    """A host's facts from its fresh report rows, freshest first.

    The panel's own host (own) may have several rows (its agent's, under its agent id) and
    falls back to this process's settings where none says: APPLIANCE_GPU_COUNT GPUs, the
    secret store this process sees. A joined host has its one row; without it nothing is
    known (the rules stay quiet; placement has checked its GPU ids against its heartbeat).
    """
    rows = list(reports)
    docker = [r.docker or {} for r in rows]
    nvml = [r for r in rows if (r.gpu_telemetry or {}).get("available")
            and r.gpu_telemetry.get("gpus")]
    gpus = [dict(g) for g in nvml[0].gpu_telemetry["gpus"]] if nvml else None
    count: int | None
    if nvml:
        count, by = max((len(r.gpu_telemetry["gpus"]), r.name) for r in nvml)
        source = f"NVML on {by}"
    elif own:
        count, source = int(settings.GPU_COUNT), f"APPLIANCE_GPU_COUNT on {name}"
    elif rows and isinstance(rows[0].gpu_telemetry, dict):
        count, source = len(rows[0].gpu_telemetry.get("gpus") or []), f"the count {name} states"
    else:
        count, source = None, ""
    if rows:
        secrets: frozenset[str] | None = frozenset(n for r in rows for n in r.secret_names or [])
    elif own:
        secrets = frozenset(secret_names_available(directory=settings.ENGINE_SECRETS_DIR))
    else:
        secrets = None
    requests = bool(settings.ENGINE_GPU_REQUESTS)
    if not own and docker and "gpu_requests" in docker[0]:
        requests = bool(docker[0]["gpu_requests"])  # the joined host's own setting
    return PreflightHost(
        name=name, reports=tuple(r.name for r in rows),
        nvidia=any(bool(d.get("nvidia")) for d in docker) if rows else None,
        runtimes=tuple(docker[0].get("runtimes") or []) if rows else (),
        gpu_requests=requests, gpus=gpus, gpu_count=count, gpu_source=source,
        secret_names=secrets,
        driver_version=nvml[0].gpu_telemetry.get("driver_version") if nvml else None)


def host_gpu_findings(*, gpus: list[int], host: PreflightHost) -> list[Finding]:
    """Pre-flight from the host's report: GPUs asked for on a host Docker can't give them."""
    if not (host.gpu_requests and gpus) or host.nvidia is not False:
        return []
    return [Finding(
        rule="host-gpu-runtime", severity="error", field="gpus",
        message=f"this host's Docker has no NVIDIA runtime ({', '.join(host.reports)}: "
                f"runtimes {', '.join(host.runtimes) or 'none'}), so the engine cannot be "
                "given GPUs.",
        fix=NO_NVIDIA_FIX)]


# The oldest Linux driver each CUDA major version's user space runs on (NVIDIA's CUDA
# compatibility table: minor-version compatibility within a major).
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}
_CUDA_IN_IMAGE = re.compile(r"(?:^|/)cuda:(\d+)\.\d+")


def host_driver_findings(*, gpus: list[int], host: PreflightHost,
                         base_image: str | None) -> list[Finding]:
    """Pre-flight: the host's NVIDIA driver is older than the engine image's CUDA needs (the
    image's self-check would refuse it after the image is built and started). Quiet where
    the driver is unknown (no NVML report) or the base image names no CUDA version."""
    found = _CUDA_IN_IMAGE.search(base_image or "")
    minimum = MIN_DRIVER_FOR_CUDA.get(int(found.group(1))) if found else None
    if not (gpus and host.gpu_requests and host.driver_version and minimum and found):
        return []
    check = check_driver(host.driver_version, minimum)
    if check.ok:
        return []
    return [Finding(
        rule="host-driver-too-old", severity="error", field="gpus",
        message=f"host {host.name}'s NVIDIA driver is {host.driver_version}; the engine image "
                f"({base_image}) is CUDA {found.group(1)}, which needs driver {minimum} or "
                "newer: its CUDA calls would fail at the engine's start.",
        fix=f"upgrade the driver on {host.name} to {minimum} or newer, run the deployment on "
            "another host (host:), or build the recipe on a base image of an older CUDA "
            "(APPLIANCE_ENGINE_BASE_IMAGE)")]


def host_gpu_inventory_findings(*, gpus: list[int], host: PreflightHost) -> list[Finding]:
    """Pre-flight: GPU ids the host does not have (NVML's count, else the one it states,
    else APPLIANCE_GPU_COUNT on the panel's own host: never unbounded, as a GPU id past the
    host's would lease a GPU that does not exist)."""
    count = host.gpu_count
    if count is None:
        return []
    missing = [g for g in gpus if g >= count]
    if not missing:
        return []
    have = f"ids 0 to {count - 1}" if count else "none"
    return [Finding(
        rule="host-gpu-inventory", severity="error", field="gpus",
        message=f"GPU ids {missing} are not on this host: it has {count} GPUs ({have}, per "
                f"{host.gpu_source}).",
        fix=f"list GPU ids from 0 to {count - 1} under gpus" if count else
            "run the deployment on a host with GPUs")]
