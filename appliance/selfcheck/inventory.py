"""What the machine has: torch and NVML (imported lazily), the driver, the GPUs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .links import nvml_topology
from .report import Check, Report

MIN_DRIVER_MAJOR = 580  # CUDA 13 user-space needs an R580 (or newer) kernel driver


# --------------------------------------------------------------------------- pure parts


def parse_driver_version(text: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4); raises ValueError on anything else."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(int(p) for p in parts)


def check_driver(version: str | None, minimum: int = MIN_DRIVER_MAJOR) -> Check:
    if version is None:
        return Check("driver-version", False, "the NVIDIA driver version could not be read",
                     "install the NVIDIA driver (580 or newer) and the container toolkit")
    try:
        major = parse_driver_version(version)[0]
    except ValueError as exc:
        return Check("driver-version", False, str(exc), "check the NVIDIA driver installation")
    if major < minimum:
        return Check(
            "driver-too-old", False,
            f"driver {version} is older than {minimum}, which CUDA 13 images need",
            f"upgrade the host driver to {minimum} or newer, or use a CUDA 12.9 (-cu129) image",
        )
    return Check("driver-version", True, f"driver {version} supports CUDA 13")


def format_cuda_version(value: int) -> str:
    """NVML's 13000 -> '13.0'."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def visible_device_ids(env: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (indices or UUIDs), or None when unset.

    NVML ignores that variable while CUDA honours it, so CUDA index i is NVML
    device ids[i]; the check must translate or it inspects the wrong GPUs.
    """
    source = os.environ if env is None else env
    raw = source.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def parse_gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--gpus takes comma-separated indices: {text!r}") from exc
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"--gpus needs distinct non-negative indices: {text!r}")
    return gpus


# --------------------------------------------------------------------------- lazy imports


def import_torch() -> tuple[Any | None, str | None]:
    try:
        import torch  # noqa: PLC0415 - optional: torch, in the engine image only
    except Exception as exc:  # ImportError, or a broken CUDA install raising OSError
        return None, f"{type(exc).__name__}: {exc}"
    return torch, None


def import_nvml() -> tuple[Any | None, str | None]:
    try:
        import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, absent on a host without NVIDIA
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- NVML


def nvml_inventory(nvml: Any, requested: Sequence[int], report: Report) -> list[Any]:
    """Fill driver, per-GPU facts and topology from NVML; returns the handles."""
    nvml.nvmlInit()
    report.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        report.cuda_driver_version = format_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    except nvml.NVMLError:
        report.cuda_driver_version = None
    visible = visible_device_ids()
    count = int(nvml.nvmlDeviceGetCount())
    handles = []
    for index in requested:
        if visible is not None and index >= len(visible):
            raise LookupError(f"GPU {index} is not in CUDA_VISIBLE_DEVICES={','.join(visible)}")
        ident = str(index) if visible is None else visible[index]
        if ident.isdigit() and int(ident) >= count:
            raise LookupError(f"GPU {ident} requested but NVML sees {count} GPU(s)")
        if ident.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(ident))
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(ident)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        report.gpus.append({
            "index": index,
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "memory_total_gb": round(mem.total / 1e9, 2),
            "memory_free_gb": round(mem.free / 1e9, 2),
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        })
        handles.append(handle)
    report.topology.update(nvml_topology(nvml, requested, handles))
    return handles
