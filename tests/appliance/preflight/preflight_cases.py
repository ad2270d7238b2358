"""Specs, recipes, model configs and host inventories the pre-flight tests share."""

from __future__ import annotations

from typing import Any

from appliance.engine.recipes import Recipe, load_recipe, recipe_from_dict
from appliance.engine.spec import DeploymentSpec, spec_from_dict
from appliance.preflight import Finding, run_preflight
from tests.specs import DDTREE_SPEC

GB = 1024**3


def kimi_config() -> dict[str, Any]:
    """Shaped like Kimi K2 / DeepSeek V3's config.json (MLA, 384 routed experts)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 262144,
        "vocab_size": 163840,
        "torch_dtype": "bfloat16",
    }


def dflash_config(block_size: int = 8) -> dict[str, Any]:
    """Shaped like a z-lab DFlash drafter's config.json, keys as sglang's dflash_utils reads."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "dflash_config": {"mask_token_id": 163838, "target_layer_ids": [1, 12, 24, 36, 48, 59]},
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 6,
        "num_target_layers": 61,
        "max_position_embeddings": 40960,
        "vocab_size": 163840,
    }


def engine(**overrides: Any) -> dict[str, Any]:
    """The shared DDTree engine options on 8 GPUs; an override of None drops the key."""
    base = {**DDTREE_SPEC["engine"], "tp_size": 8}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def make_spec(gpus: int = 8, extra_args: list[str] | None = None, **overrides: Any) -> DeploymentSpec:
    return spec_from_dict({"name": "t", "recipe": "kimi-k2.6-ddtree", "gpus": list(range(gpus)),
                           "engine": engine(**overrides), "extra_args": extra_args or []})


SOURCES = {"101": "101cd5bd02faab336ada94f78daada6288c1816e",
           "398": "398fc2c7261af88b93b772ab1c9d6c4dba612745",
           "433": "433c58ed70cd1dabe5a07a83da12f1513cd599ae",
           "unknown": "0123456789abcdef0123456789abcdef01234567"}
H200 = {"name": "NVIDIA H200", "uuid": "GPU-0"}
B200 = {"name": "NVIDIA B200", "uuid": "GPU-1"}
RTX_PRO = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "uuid": "GPU-2"}


def source_recipe(short: str, patches: list[str] | None = None) -> Recipe:
    """A site recipe pinning one SGLang source by commit; its name says nothing of the source."""
    return recipe_from_dict({"name": "site-ddtree", "base_image": "img",
                             "sglang": {"git": "https://git.example/sglang", "ref": SOURCES[short]},
                             "patches": patches or []})


def host(*gpus: dict[str, Any], count: int = 8) -> list[dict[str, Any]]:
    """A host inventory as NVML reports it: the given GPU model(s) at indices 0..count-1."""
    return [{**gpus[i % len(gpus)], "index": i} for i in range(count)]


def unpatched() -> Recipe:
    data = {"name": "ddtree-raw", "base_image": "img",
            "sglang": {"git": "https://github.com/sgl-project/sglang",
                       "ref": "101cd5bd02faab336ada94f78daada6288c1816e",
                       "flags": "sglang-ddtree-101cd5bd0"},
            "patches": []}
    return recipe_from_dict(data)


def check(spec: DeploymentSpec, recipe: Recipe | None = None, **kw: Any) -> list[Finding]:
    kw.setdefault("model_config", kimi_config())
    kw.setdefault("drafter_config", dflash_config())
    return run_preflight(spec, recipe=recipe or load_recipe(spec.recipe),
                         read_local_configs=False, **kw)


def by_rule(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


def severities(findings: list[Finding], rule: str) -> set[str]:
    return {f.severity for f in by_rule(findings, rule)}
