"""Tiny random-weight models of Kimi K2.6's architecture for the real-engine rig.

    python3 tests/gpu/realengine/models.py OUTDIR

Writes, each with a character tokenizer built locally with `tokenizers` (no hub):
- tiny-kimi: DeepseekV3ForCausalLM with Kimi K2's exact MLA dimensions (q_lora_rank 1536,
  kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128) and its 8 attention heads per GPU at TP8;
  hidden 256, 3 layers (layer 0 dense, 1-2 MoE: 8 routed experts top-2 + 1 shared, sigmoid
  scores with the noaux_tc bias), Kimi's yarn rope and 262,144 positions; bf16. Routing is
  pinned by the correction bias (experts 0 and 1 always win), so the only source of output
  differences between runs is the attention/verify path, not a discrete routing flip.
- tiny-kimi-dflash: DFlashDraftModel (qwen3 layers, as the public DFlash drafters), 2 layers,
  block 8, target_layer_ids [0, 1], mask token <|MASK|>.
- tiny-kimi-dflash-h384: the same drafter with hidden size 384 (a drafter for another
  target), for the recorded mismatch failure.
- tiny-kimi-int4: tiny-kimi in Kimi K2.6's own checkpoint format: the routed experts' weights
  quantized to INT4, group-wise (32) symmetric, packed eight to an int32 by compressed-tensors'
  own packer (`weight_packed`, `weight_scale`, `weight_shape` per projection), everything else
  bf16 as in tiny-kimi; its config carries Kimi K2.6's `quantization_config` (QUANTIZATION
  below, with its ignore list). The bf16 drafter serves it too.
- big-kimi (only with --big): the same architecture at hidden 1024, 8 layers, 64 routed
  experts of inner size 2048 (5.7 GB bf16, one shard per layer as real checkpoints come), for
  the load-time measurement; random on the GPU (seeded), not hashed.

Deterministic: fixed seeds on a CPU generator, so a GPU host rebuilds the same bytes instead
of carrying them (the sha256 printed is the check).
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

SPECIALS = [
    "[BOS]", "[EOS]", "[PAD]", "[UNK]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
    "<|im_system|>", "<|im_middle|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>", "[EOT]", "<|MASK|>",
]
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
VOCAB_SIZE = 128
# Kimi K2.6's `text_config.quantization_config` as published (moonshotai/Kimi-K2.6 config.json;
# the same method as Kimi-K2-Thinking, whose DeepseekV3ForCausalLM config carries it at the
# top level, as this tiny DeepseekV3ForCausalLM does): INT4 weight-only, group 32, symmetric,
# routed experts only. The vision patterns match nothing here; kept, as published.
QUANTIZATION: dict[str, Any] = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                    "group_size": 32, "num_bits": 4, "observer": "minmax",
                    "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                    "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
               "re:vision_tower.*", "re:mm_projector.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
ROUTED = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def write_tokenizer(folder: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for char in chars:
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": False,
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": 262144, "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    return vocab


def target_config(vocab: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": vocab["[BOS]"], "eos_token_id": vocab["[EOS]"], "pad_token_id": vocab["[PAD]"],
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "hidden_act": "silu",
        "hidden_size": 256, "intermediate_size": 512, "initializer_range": 0.02,
        "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.827,
        "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 3,
        "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


def drafter_config(vocab: dict[str, int], hidden: int = 256) -> dict[str, Any]:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "attention_bias": False, "attention_dropout": 0.0, "block_size": 8,
        "dflash_config": {"mask_token": "<|MASK|>", "mask_token_id": vocab["<|MASK|>"],
                          "target_layer_ids": [0, 1]},
        "num_target_layers": 3,
        "bos_token_id": vocab["[BOS]"], "eos_token_id": vocab["[EOS]"],
        "head_dim": 128, "hidden_act": "silu", "hidden_size": hidden, "intermediate_size": 512,
        "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 262144, "max_window_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


class Init:
    """Seeded bf16 tensors: a scaled normal for projections, constants for norms."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def linear(self, rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
        weight = torch.randn(rows, cols, generator=self.generator) * (gain / cols ** 0.5)
        return weight.to(torch.bfloat16)

    def embed(self, rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=self.generator).to(torch.bfloat16)

    @staticmethod
    def const(n: int, value: float = 1.0) -> torch.Tensor:
        return torch.full((n,), value, dtype=torch.bfloat16)


class Shapes(Init):
    """The same tensors' names and shapes with no data (meta tensors): big-kimi's plan."""

    def linear(self, rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=torch.bfloat16, device="meta")

    def embed(self, rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=torch.bfloat16, device="meta")

    @staticmethod
    def const(n: int, value: float = 1.0) -> torch.Tensor:
        return torch.empty(n, dtype=torch.bfloat16, device="meta")


def mlp(init: Init, prefix: str, hidden: int, inner: int) -> dict[str, torch.Tensor]:
    return {prefix + "gate_proj.weight": init.linear(inner, hidden),
            prefix + "up_proj.weight": init.linear(inner, hidden),
            prefix + "down_proj.weight": init.linear(hidden, inner, gain=0.5)}


def attention(init: Init, prefix: str, c: dict[str, Any]) -> dict[str, torch.Tensor]:
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    return {
        prefix + "q_a_proj.weight": init.linear(c["q_lora_rank"], hidden),
        prefix + "q_a_layernorm.weight": init.const(c["q_lora_rank"]),
        prefix + "q_b_proj.weight": init.linear(heads * qk, c["q_lora_rank"]),
        prefix + "kv_a_proj_with_mqa.weight": init.linear(
            c["kv_lora_rank"] + c["qk_rope_head_dim"], hidden),
        prefix + "kv_a_layernorm.weight": init.const(c["kv_lora_rank"]),
        prefix + "kv_b_proj.weight": init.linear(
            heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]),
        prefix + "o_proj.weight": init.linear(hidden, heads * c["v_head_dim"], gain=0.5),
    }


def moe(init: Init, prefix: str, c: dict[str, Any]) -> dict[str, torch.Tensor]:
    hidden, inner, experts = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
    bias = torch.zeros(experts, dtype=torch.float32)
    bias[: c["num_experts_per_tok"]] = 8.0  # sigmoid scores lie in (0, 1): these always win
    weights = {prefix + "gate.weight": init.linear(experts, hidden),
               prefix + "gate.e_score_correction_bias": bias}
    for expert in range(experts):
        weights.update(mlp(init, f"{prefix}experts.{expert}.", hidden, inner))
    weights.update(mlp(init, prefix + "shared_experts.", hidden, inner * c["n_shared_experts"]))
    return weights


def target_weights(c: dict[str, Any], init: Init | None = None) -> dict[str, torch.Tensor]:
    init = init or Init(1234)
    hidden = c["hidden_size"]
    # A large head gain: confident logits, so bf16 kernel noise rarely flips a greedy argmax.
    weights = {"model.embed_tokens.weight": init.embed(c["vocab_size"], hidden),
               "model.norm.weight": init.const(hidden),
               "lm_head.weight": init.linear(c["vocab_size"], hidden, gain=4.0)}
    for layer in range(c["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = init.const(hidden)
        weights[prefix + "post_attention_layernorm.weight"] = init.const(hidden)
        weights.update(attention(init, prefix + "self_attn.", c))
        if layer < c["first_k_dense_replace"]:
            weights.update(mlp(init, prefix + "mlp.", hidden, c["intermediate_size"]))
        else:
            weights.update(moe(init, prefix + "mlp.", c))
    return weights


def drafter_weights(c: dict[str, Any]) -> dict[str, torch.Tensor]:
    init = Init(5678)
    hidden, heads, kv_heads, head_dim = (c["hidden_size"], c["num_attention_heads"],
                                         c["num_key_value_heads"], c["head_dim"])
    layers = len(c["dflash_config"]["target_layer_ids"])
    # A small final norm: flat draft distributions, so DDTree builds broad trees.
    weights = {"fc.weight": init.linear(hidden, layers * hidden),
               "hidden_norm.weight": init.const(hidden), "norm.weight": init.const(hidden, 0.25)}
    for layer in range(c["num_hidden_layers"]):
        prefix = f"layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = init.const(hidden)
        weights[prefix + "post_attention_layernorm.weight"] = init.const(hidden)
        weights[prefix + "self_attn.q_proj.weight"] = init.linear(heads * head_dim, hidden)
        weights[prefix + "self_attn.k_proj.weight"] = init.linear(kv_heads * head_dim, hidden)
        weights[prefix + "self_attn.v_proj.weight"] = init.linear(kv_heads * head_dim, hidden)
        weights[prefix + "self_attn.o_proj.weight"] = init.linear(hidden, heads * head_dim, gain=0.5)
        weights[prefix + "self_attn.q_norm.weight"] = init.const(head_dim)
        weights[prefix + "self_attn.k_norm.weight"] = init.const(head_dim)
        weights.update(mlp(init, prefix + "mlp.", hidden, c["intermediate_size"]))
    return weights


def write_model(folder: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    path = folder / "model.safetensors"
    save_file(weights, str(path), metadata={"format": "pt"})
    write_tokenizer(folder)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    params = sum(t.numel() for t in weights.values()) / 1e6
    print(f"{folder.name}: {len(weights)} tensors, {params:.2f} M params, "
          f"{path.stat().st_size / 1e6:.1f} MB, sha256 {digest}")


def quantize_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group-wise INT4 as compressed-tensors' minmax observer makes it: the scale is
    the group's largest magnitude over half the 4-bit range (15 / 2), values clamped to
    [-8, 7]; returns the int8 values and the bf16 scales [rows, cols / group]."""
    rows, cols = weight.shape
    grouped = weight.float().reshape(rows, cols // group, group)
    scale = (grouped.abs().amax(dim=-1) / 7.5).clamp_min(1e-8).to(torch.bfloat16)
    q = torch.clamp(torch.round(grouped / scale.float().unsqueeze(-1)), -8, 7).to(torch.int8)
    return q.reshape(rows, cols), scale


def int4_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """tiny-kimi's tensors with each routed expert projection in compressed-tensors'
    pack-quantized layout; packing by the library itself, then unpacked again as a check."""
    from compressed_tensors.compressors.pack_quantized.helpers import (
        pack_to_int32,
        unpack_from_int32,
    )

    group = QUANTIZATION["config_groups"]["group_0"]["weights"]["group_size"]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if not ROUTED.match(name):
            out[name] = tensor
            continue
        base = name[: -len("weight")]
        q, scale = quantize_int4(tensor, group)
        packed = pack_to_int32(q, 4)
        if not torch.equal(unpack_from_int32(packed, 4, q.shape), q):
            raise SystemExit(f"{name}: compressed-tensors does not unpack what it packed")
        out[base + "weight_packed"] = packed
        out[base + "weight_scale"] = scale
        out[base + "weight_shape"] = torch.tensor(list(tensor.shape), dtype=torch.int64)
    return out


def big_config(vocab: dict[str, int]) -> dict[str, Any]:
    return {**target_config(vocab), "hidden_size": 1024, "intermediate_size": 4096,
            "num_hidden_layers": 8, "n_routed_experts": 64, "moe_intermediate_size": 2048}


def write_big(folder: Path) -> None:
    """big-kimi: tensors made on the GPU where there is one (fast), saved a shard per layer."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    config = big_config(vocab)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
         "do_sample": False}, indent=1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(4321)
    shapes = {name: tensor.shape for name, tensor in target_weights(config, Shapes(0)).items()}
    layers = config["num_hidden_layers"]
    shards: dict[str, list[str]] = {f"model-{i + 1:05d}-of-{layers + 1:05d}.safetensors": []
                                    for i in range(layers + 1)}
    files = list(shards)
    for name in shapes:
        index = int(name.split(".")[2]) if name.startswith("model.layers.") else layers
        shards[files[index]].append(name)
    weight_map, total = {}, 0
    for file, members in shards.items():
        tensors = {}
        for name in members:
            shape = shapes[name]
            if name.endswith("e_score_correction_bias"):
                bias = torch.zeros(shape, dtype=torch.float32)
                bias[: config["num_experts_per_tok"]] = 8.0
                tensors[name] = bias
            elif len(shape) == 1:
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                scale = 1.0 / shape[1] ** 0.5
                tensors[name] = (torch.randn(shape, generator=generator, device=device) * scale
                                 ).to(torch.bfloat16).cpu()
            weight_map[name] = file
            total += tensors[name].numel() * tensors[name].element_size()
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    print(f"{folder.name}: {len(weight_map)} tensors in {len(files)} shards, {total / 1e9:.2f} GB")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if "--big" in sys.argv[2:]:
        write_big(out / "big-kimi")
        return
    probe = out / "tiny-kimi"
    probe.mkdir(exist_ok=True)
    vocab = write_tokenizer(probe)
    target = target_config(vocab)
    write_model(probe, target, target_weights(target))
    drafter = drafter_config(vocab)
    write_model(out / "tiny-kimi-dflash", drafter, drafter_weights(drafter))
    wrong = drafter_config(vocab, hidden=384)
    write_model(out / "tiny-kimi-dflash-h384", wrong, drafter_weights(wrong))
    int4 = out / "tiny-kimi-int4"
    int4.mkdir(exist_ok=True)
    write_model(int4, {**target, "quantization_config": QUANTIZATION},
                int4_weights(target_weights(target)))


if __name__ == "__main__":
    main()
