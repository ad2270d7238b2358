"""What the store shows of a model's config.json: its architecture, the key sizes, and
whether it is a target or a DFlash block drafter (with the block size and target layers
it was trained for).

Read as SGLang reads them: multimodal checkpoints (Kimi K2.5/K2.6) nest the language model
under text_config; a DFlash drafter keeps its fields under dflash_config, else at the top
level (sglang's parse_dflash_draft_config, appliance.preflight.context.drafter_block_size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from appliance.engine.model_config import drafter_block_size, is_mla, text_config

CONFIG_NAME = "config.json"
# The sizes a person compares models by and pre-flight checks a drafter against.
_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size",
         "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
# MoE: the names differ per family (DeepSeek/Kimi n_routed_experts, Qwen/Mixtral num_experts).
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim")
_DRAFTER_ARCH = "dflash"


def read_config_file(folder: Path) -> dict[str, Any] | None:
    """config.json of a folder, or None (absent, unreadable, not a JSON object)."""
    try:
        data = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_drafter(config: dict[str, Any]) -> bool:
    """A DFlash block drafter: a dflash_config, or a DFlash architecture name."""
    archs = " ".join(str(a) for a in config.get("architectures") or []).lower()
    return isinstance(config.get("dflash_config"), dict) or _DRAFTER_ARCH in archs


def _quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    keys = ("quant_method", "bits", "fmt", "weight_block_size")
    return {k: quant[k] for k in keys if k in quant} or {"quant_method": "unknown"}


def _drafter_fields(config: dict[str, Any]) -> dict[str, Any]:
    raw = config.get("dflash_config")
    sub: dict[str, Any] = raw if isinstance(raw, dict) else {}
    layers = sub.get("target_layer_ids", config.get("target_layer_ids"))
    trained = sub.get("num_target_layers", config.get("num_target_layers"))
    return {"block_size": drafter_block_size(config),
            "target_layer_ids": layers if isinstance(layers, list) else None,
            "num_target_layers": trained if isinstance(trained, int) else None}


def config_summary(config: dict[str, Any]) -> dict[str, Any]:
    """The key values, flat and JSON-ready; a key the config lacks is left out."""
    model = text_config(config) or {}
    summary: dict[str, Any] = {"architectures": list(config.get("architectures") or [])}
    summary.update({k: model[k] for k in _KEYS if model.get(k) is not None})
    experts = next((model[k] for k in _EXPERT_KEYS if model.get(k) is not None), None)
    if experts is not None:
        summary["experts"] = experts
        summary["experts_per_token"] = model.get("num_experts_per_tok")
    if is_mla(model):
        summary["mla"] = {k: model[k] for k in _MLA_KEYS if model.get(k) is not None}
    quant = _quantization(model)
    if quant:
        summary["quantization"] = quant
    dtype = model.get("torch_dtype") or model.get("dtype")
    if dtype:
        summary["dtype"] = str(dtype)
    if is_drafter(config):
        summary["drafter"] = _drafter_fields(config)
    return summary
