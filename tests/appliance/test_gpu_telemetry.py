"""GPU telemetry where there is no GPU (CI): it says so, with no readings at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.runtime.gpu_telemetry import NO_TELEMETRY, collect


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a GPU host: tests/gpu covers it")
def test_a_host_without_nvml_reports_no_telemetry_rather_than_zeros() -> None:
    snapshot = collect()
    assert snapshot.available is False
    assert snapshot.reason.startswith(NO_TELEMETRY)
    assert "NVML could not start" in snapshot.reason  # nvidia-ml-py is installed, no driver
    assert snapshot.gpus == []
    assert snapshot.to_dict()["gpus"] == []
