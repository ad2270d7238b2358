"""The simulator (the test engine image, docker/test-engine/) as the product meets it: the
label that marks its image, and the model folders it can serve.

An engine image carrying `SIMULATOR_LABEL` is the simulator: it prints SGLang's log lines
and answers its HTTP endpoints but runs no model, so whatever it reports is not a
measurement. Agents report which of their images carry it (their Docker facts), and the
panel labels every deployment, benchmark and losslessness result that used one.

    python3 -m appliance.simulator models DIR   # the simulator's model folders in DIR
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

SIMULATOR_LABEL = "appliance.simulator"
MAX_SIMULATOR_TAGS = 32  # a host's report stays small (the fleet's heartbeat: 8 KiB)

# What pre-flight reads of a model folder (appliance/preflight/files.py): a config.json
# and whole safetensors weights. `test` is a target, `test-dflash` a DFlash drafter for it
# (a DDTREE or DFLASH deployment of the simulator names both).
SIMULATOR_MODELS: dict[str, dict[str, object]] = {
    "test": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "test-dflash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"},
}


def simulator_tags(client: Any) -> list[str]:
    """The tags of a Docker engine's images that carry the simulator's label (a docker
    client): what an agent reports in its Docker facts as `simulator_images`."""
    images = client.images.list(filters={"label": SIMULATOR_LABEL})
    return sorted({tag for image in images for tag in image.tags})[:MAX_SIMULATOR_TAGS]


def _safetensors(values: int = 4) -> bytes:
    """A whole safetensors file: one float32 tensor of `values` zeros."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values],
                               "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * values)


def simulator_models_write(*, root: Path) -> list[Path]:
    """The simulator's model folders under root, each made only when missing; the folders."""
    made = []
    for name, config in SIMULATOR_MODELS.items():
        folder = root / name
        if not (folder / "config.json").exists():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.safetensors").write_bytes(_safetensors())
            (folder / "config.json").write_text(json.dumps(config))
        made.append(folder)
    return made


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "models":
        print("usage: python3 -m appliance.simulator models DIR", file=sys.stderr)
        return 2
    for folder in simulator_models_write(root=Path(argv[1])):
        print(f"simulator model folder: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
