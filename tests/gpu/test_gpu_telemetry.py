"""GPU telemetry on a real GPU host (NVML): every GPU, plausible readings, no fake zeros."""

from __future__ import annotations

from appliance.runtime.gpu_telemetry import collect


def test_it_reads_every_gpu_with_plausible_figures(cuda_count: int) -> None:
    snapshot = collect()
    assert snapshot.available, snapshot.reason
    assert snapshot.driver_version
    assert len(snapshot.gpus) >= cuda_count
    for gpu in snapshot.gpus:
        assert gpu.name and gpu.uuid.startswith("GPU-")
        assert gpu.utilization_pct is not None and 0 <= gpu.utilization_pct <= 100
        assert gpu.memory_total_gb and 0 <= (gpu.memory_used_gb or 0) <= gpu.memory_total_gb
        assert gpu.power_w and 0 < gpu.power_w <= (gpu.power_limit_w or 2000)
        assert gpu.temperature_c and 0 < gpu.temperature_c < 110
        assert gpu.sm_clock_mhz and gpu.sm_clock_mhz > 0
