"""GPU telemetry through NVML (nvidia-ml-py): one snapshot of every GPU on this host.

Per GPU: utilisation, memory used and total, power, temperature, SM clock, and PCIe and
NVLink throughput where NVML gives them. Each reading that NVML refuses on a given GPU
or driver is None, never 0: a missing number must not read as an idle GPU. On a host
without NVML (no driver, no nvidia-ml-py) the snapshot says so and holds no GPUs.

    python3 -m appliance.runtime.gpu_telemetry          # one JSON snapshot
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

NO_TELEMETRY = "no GPU telemetry on this host"
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper


@dataclass
class GpuReading:
    index: int
    name: str
    uuid: str
    utilization_pct: float | None = None
    memory_used_gb: float | None = None
    memory_total_gb: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    pcie_tx_mb_s: float | None = None
    pcie_rx_mb_s: float | None = None
    nvlink_active_links: int | None = None
    nvlink_tx_mb_s: float | None = None
    nvlink_rx_mb_s: float | None = None


@dataclass
class Telemetry:
    available: bool
    reason: str = ""
    driver_version: str | None = None
    taken_at: float = field(default_factory=time.time)
    gpus: list[GpuReading] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read(call: Callable[[], Any]) -> Any:
    """One NVML reading, None when this GPU or driver does not support it."""
    try:
        return call()
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: no reading
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlink(nvml: Any, handle: Any, reading: GpuReading, interval_s: float) -> None:
    """Active links, and throughput from NVML's NVLink byte counters over interval_s."""
    active = [link for link in range(NVLINK_MAX_LINKS)
              if _read(functools.partial(nvml.nvmlDeviceGetNvLinkState, handle, link)) == 1]
    reading.nvlink_active_links = len(active)
    if not active or not hasattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"):
        return
    fields = [nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
              nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]

    def counters() -> list[int] | None:
        values = _read(lambda: nvml.nvmlDeviceGetFieldValues(handle, fields))
        if not values or any(v.nvmlReturn != 0 for v in values):
            return None
        return [int(v.value.ullVal) for v in values]  # KiB since the driver loaded

    first = counters()
    time.sleep(interval_s)
    second = counters()
    if first and second:
        reading.nvlink_tx_mb_s = (second[0] - first[0]) / 1024 / interval_s
        reading.nvlink_rx_mb_s = (second[1] - first[1]) / 1024 / interval_s


def read_gpu(nvml: Any, index: int, nvlink_interval_s: float = 0.1) -> GpuReading:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    reading = GpuReading(index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
                         uuid=_text(nvml.nvmlDeviceGetUUID(handle)))
    util = _read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    reading.utilization_pct = float(util.gpu) if util is not None else None
    memory = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        reading.memory_used_gb = memory.used / 1e9
        reading.memory_total_gb = memory.total / 1e9
    power = _read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))  # milliwatts
    reading.power_w = power / 1000 if power is not None else None
    limit = _read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    reading.power_limit_w = limit / 1000 if limit is not None else None
    reading.temperature_c = _read(lambda: float(nvml.nvmlDeviceGetTemperature(
        handle, nvml.NVML_TEMPERATURE_GPU)))
    reading.sm_clock_mhz = _read(lambda: float(nvml.nvmlDeviceGetClockInfo(
        handle, nvml.NVML_CLOCK_SM)))
    tx = _read(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
    rx = _read(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES))
    reading.pcie_tx_mb_s = tx / 1024 if tx is not None else None  # NVML gives KB/s
    reading.pcie_rx_mb_s = rx / 1024 if rx is not None else None
    _nvlink(nvml, handle, reading, nvlink_interval_s)
    return reading


def collect(nvml: Any | None = None) -> Telemetry:
    """A snapshot of every GPU NVML sees; available=False (with the reason) without NVML."""
    if nvml is None:
        try:
            import pynvml as nvml_module  # noqa: PLC0415 - optional: nvidia-ml-py, absent on a host without NVIDIA
        except ImportError:
            return Telemetry(False, f"{NO_TELEMETRY}: nvidia-ml-py is not installed")
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no library: say so
        return Telemetry(False, f"{NO_TELEMETRY}: NVML could not start ({exc})")
    try:
        count = nvml.nvmlDeviceGetCount()
        driver = _read(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        return Telemetry(True, driver_version=driver,
                         gpus=[read_gpu(nvml, i) for i in range(count)])
    finally:
        _read(nvml.nvmlShutdown)


_held: dict[str, Any] = {}  # NVML, initialised once for the process's quick readings


def _held_nvml() -> Any | None:
    """NVML kept open (nvmlInit is counted, so collect()'s own init/shutdown still pair up)."""
    if "nvml" not in _held:
        try:
            import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, absent on a host without NVIDIA

            pynvml.nvmlInit()
            _held["nvml"] = pynvml
        except Exception:  # noqa: BLE001 - no library or no driver: no readings, ever
            _held["nvml"] = None
    return _held["nvml"]


def quick(indices: list[int], nvml: Any | None = None) -> list[list[float | None]]:
    """[utilisation %, memory used GB, memory total GB] of the GPUs at `indices` (NVML
    indices, as Docker's device requests name them): the monitor's per-scrape reading,
    a few NVML calls per GPU, no NVLink sampling. [] without NVML."""
    nvml = nvml or _held_nvml()
    if nvml is None:
        return []
    rows: list[list[float | None]] = []
    for index in indices:
        handle = _read(functools.partial(nvml.nvmlDeviceGetHandleByIndex, index))
        if handle is None:
            rows.append([None, None, None])
            continue
        util = _read(functools.partial(nvml.nvmlDeviceGetUtilizationRates, handle))
        memory = _read(functools.partial(nvml.nvmlDeviceGetMemoryInfo, handle))
        rows.append([float(util.gpu) if util is not None else None,
                     memory.used / 1e9 if memory is not None else None,
                     memory.total / 1e9 if memory is not None else None])
    return rows


if __name__ == "__main__":
    json.dump(collect().to_dict(), sys.stdout, indent=1)
    print()
