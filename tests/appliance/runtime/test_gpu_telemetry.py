"""GPU telemetry where there is no GPU (CI): it says so, with no readings at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.runtime.gpu_telemetry import NO_TELEMETRY, collect, quick


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a GPU host: tests/gpu covers it")
def test_a_host_without_nvml_reports_no_telemetry_rather_than_zeros() -> None:
    snapshot = collect()
    assert snapshot.available is False
    assert snapshot.reason.startswith(NO_TELEMETRY)
    assert "NVML could not start" in snapshot.reason  # nvidia-ml-py is installed, no driver
    assert snapshot.gpus == []
    assert snapshot.to_dict()["gpus"] == []


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a GPU host: tests/gpu covers it")
def test_the_monitors_quick_reading_is_empty_without_nvml() -> None:
    assert quick([0, 1]) == []


class _Nvml:
    """Two GPUs as NVML answers (bytes, integer percent); index 5 is not there."""

    class _Util:
        gpu = 87

    class _Memory:
        used, total = 120_500_000_000, 143_771_000_000

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index > 1:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> object:  # noqa: N802
        return self._Util()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:  # noqa: N802
        return self._Memory()


def test_the_quick_reading_gives_utilisation_and_memory_of_the_named_gpus() -> None:
    # Run on an H200 (driver 580.159.04): [[0.0, 0.64, 150.75]] at 0.011 ms a call.
    assert quick([1, 5], nvml=_Nvml()) == [[87.0, 120.5, 143.771], [None, None, None]]
