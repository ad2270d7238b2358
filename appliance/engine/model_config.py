"""What a checkpoint's config.json says that both the pre-flight rules and the model store
read: the language model of a multimodal checkpoint, whether it uses multi-head latent
attention (MLA), and a DFlash drafter's block size."""

from __future__ import annotations

import re
from typing import Any


def text_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """Multimodal checkpoints (Kimi K2.5/K2.6) nest the language model under text_config."""
    if config is None:
        return None
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def is_mla(model: dict[str, Any] | None) -> bool | None:
    if model is None:
        return None
    if model.get("kv_lora_rank"):
        return True
    arch = " ".join(model.get("architectures") or []) + " " + str(model.get("model_type", ""))
    return bool(re.search(r"deepseek_?v[23]|kimi_?k2", arch, re.IGNORECASE))


def drafter_block_size(drafter: dict[str, Any] | None) -> int | None:
    """As sglang's parse_dflash_draft_config: dflash_config.block_size, else top-level."""
    if drafter is None:
        return None
    sub = drafter.get("dflash_config") or {}
    value = sub.get("block_size", drafter.get("block_size"))
    return int(value) if value is not None else None
