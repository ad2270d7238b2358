"""Real small model folders for the suite's specs: pre-flight refuses a model path with no
config.json or weight files (appliance/preflight/files.py), so every path a test deploys
is a folder with both, made outside the work tree."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# config.json of each folder the specs name: the facts the rules read (MLA for Kimi) and
# nothing that makes a rule fire on its own (no auto_map, no head counts).
CONFIGS: dict[str, dict[str, Any]] = {
    "Kimi-K2.6": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
                  "kv_lora_rank": 512},
    "Kimi-K2.6-DFlash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"},
    "test": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
}


def safetensors_bytes(values: int = 4) -> bytes:
    """A valid safetensors file: one float32 tensor of `values` zeros."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values],
                               "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * values)


def write_model(folder: Path, config: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(safetensors_bytes())
    return folder


def write_models(root: Path) -> Path:
    """Every folder in CONFIGS under root (the suite's APPLIANCE_MODEL_ROOTS)."""
    for name, config in CONFIGS.items():
        write_model(root / name, config)
    return root
