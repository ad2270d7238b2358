"""The pre-flight rules' shared helpers (the block size and DDTree budget a context gives),
and the readers of local checkpoint files (config.json, weight sizes) that fill a Context
(appliance.preflight.types). What a config.json says (its text config, MLA, a drafter's
block size) is appliance.engine.model_config's: the model store reads it too."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from appliance.engine.model_config import drafter_block_size
from appliance.preflight.types import Context

# ---------------------------------------------------------------- helpers

def block_size(ctx: Context) -> int | None:
    e = ctx.engine
    return e.speculative_num_draft_tokens or e.speculative_dflash_block_size or \
        drafter_block_size(ctx.drafter)


def ddtree_budget(ctx: Context) -> int | None:
    """The PR's rule: --speculative-ddtree-budget, else block size minus 1."""
    if ctx.engine.speculative_ddtree_budget is not None:
        return ctx.engine.speculative_ddtree_budget
    block = block_size(ctx)
    return block - 1 if block else None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = re.findall(r"\d+", text.split("+")[0])
    return tuple(int(n) for n in nums[:3]) if nums else None


# ---------------------------------------------------------------- local files

def read_config(path: str | None) -> dict[str, Any] | None:
    """config.json of a checkpoint directory when it exists on this machine."""
    if not path:
        return None
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_weights_bytes(path: str | None) -> int | None:
    """Checkpoint size: model.safetensors.index.json metadata.total_size, else the shard sizes."""
    if not path or not Path(path).is_dir():
        return None
    index = Path(path) / "model.safetensors.index.json"
    try:
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int):
            return total
    except (OSError, ValueError):
        pass
    shards = list(Path(path).glob("*.safetensors"))
    return sum(s.stat().st_size for s in shards) if shards else None
