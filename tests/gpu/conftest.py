"""GPU tests: they need torch with a CUDA device, and skip cleanly anywhere else (CI)."""

from __future__ import annotations

import pytest


def _cuda_devices() -> int:
    try:
        import torch
    except Exception:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = str(config.rootpath / "tests" / "gpu")
    gpu_items = [item for item in items if str(item.path).startswith(here)]
    if not gpu_items:
        return
    skip = None if _cuda_devices() else pytest.mark.skip(reason="needs torch and an NVIDIA GPU")
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_count() -> int:
    return _cuda_devices()
