"""Pre-flight rules: each fires on a bad deployment and stays quiet on a good one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from appliance.engine.recipes import Recipe, load_recipe, recipe_from_dict
from appliance.engine.spec import DeploymentSpec, SpecError, spec_from_dict
from appliance.preflight import RULES, Finding, gpu_major, has_errors, run_preflight
from tests.web.specs import DDTREE_SPEC

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


def test_the_flagship_spec_has_no_errors_or_warnings() -> None:
    findings = check(make_spec())
    assert not [f for f in findings if f.severity != "info"], findings


# ---- ddtree-verify-width

def test_it_blocks_ddtree_graphs_without_the_width_patch_naming_both_widths() -> None:
    (finding,) = by_rule(check(make_spec(), recipe=unpatched()), "ddtree-verify-width")
    assert finding.severity == "error"
    assert "(8 tokens per request)" in finding.message and "= 33" in finding.message
    assert "ddtree-verify-graph-width" in finding.fix and "disable_cuda_graph" in finding.fix


def test_it_states_the_two_widths_when_the_patch_is_in_the_recipe() -> None:
    (finding,) = by_rule(check(make_spec(speculative_ddtree_budget=16)), "ddtree-verify-width")
    assert finding.severity == "info"
    assert "width 17 (budget+1)" in finding.message and "width 8 (block size)" in finding.message


def test_it_stays_quiet_about_verify_width_with_cuda_graphs_off() -> None:
    findings = check(make_spec(disable_cuda_graph=True), recipe=unpatched())
    assert not by_rule(findings, "ddtree-verify-width")


# ---- ddtree-budget

def test_it_rejects_a_budget_below_one() -> None:
    assert severities(check(make_spec(speculative_ddtree_budget=0)), "ddtree-budget") == {"error"}


def test_it_says_the_budget_defaults_to_block_size_minus_one() -> None:
    (finding,) = by_rule(check(make_spec(speculative_ddtree_budget=None)), "ddtree-budget")
    assert finding.severity == "info" and "= 7" in finding.message


def test_it_warns_that_a_budget_without_ddtree_is_ignored() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", attention_backend=None)
    assert severities(check(spec), "ddtree-budget") == {"warning"}


def test_it_stays_quiet_about_an_explicit_valid_budget() -> None:
    assert not by_rule(check(make_spec()), "ddtree-budget")


# ---- tree-attention-backend

def test_it_rejects_flashinfer_for_tree_verify_on_an_mla_model() -> None:
    findings = check(make_spec(attention_backend="flashinfer"))
    assert severities(findings, "tree-attention-backend") == {"error"}


def test_it_accepts_flashinfer_on_a_non_mla_model() -> None:
    gqa = {k: v for k, v in kimi_config().items() if k not in ("kv_lora_rank", "model_type")}
    gqa.update(architectures=["Qwen3ForCausalLM"], num_key_value_heads=8)
    findings = check(make_spec(attention_backend="flashinfer"), model_config=gqa)
    assert not by_rule(findings, "tree-attention-backend")


def test_it_rejects_a_backend_without_a_tree_mask() -> None:
    findings = check(make_spec(attention_backend="flashmla"))
    assert severities(findings, "tree-attention-backend") == {"error"}


def test_it_warns_when_no_backend_is_chosen_for_ddtree() -> None:
    findings = check(make_spec(attention_backend=None))
    assert severities(findings, "tree-attention-backend") == {"warning"}


@pytest.mark.parametrize("backend", ["fa3", "triton"])
def test_it_accepts_tree_capable_backends(backend: str) -> None:
    assert not by_rule(check(make_spec(attention_backend=backend)), "tree-attention-backend")


def test_it_finds_mla_inside_a_multimodal_text_config() -> None:
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": kimi_config()}
    findings = check(make_spec(attention_backend="flashinfer"), model_config=nested)
    assert severities(findings, "tree-attention-backend") == {"error"}


# ---- dflash-dp-attention

def test_it_rejects_dflash_dp_attention_without_the_dp_lm_head() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None,
                     enable_dp_attention=True, dp_size=8)
    recipe = load_recipe("kimi-k2.6-dflash")
    assert severities(check(spec, recipe=recipe), "dflash-dp-attention") == {"error"}


def test_it_accepts_dflash_dp_attention_with_the_dp_lm_head_on_0_5_23() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None,
                     enable_dp_attention=True, enable_dp_lm_head=True, dp_size=8)
    recipe = load_recipe("kimi-k2.6-dflash")
    assert not by_rule(check(spec, recipe=recipe), "dflash-dp-attention")


def test_it_rejects_ddtree_with_dp_attention() -> None:
    spec = make_spec(enable_dp_attention=True, enable_dp_lm_head=True, dp_size=8)
    assert severities(check(spec), "dflash-dp-attention") == {"error"}


# ---- dflash-pipeline-parallel

def test_it_rejects_pipeline_parallel_with_dflash() -> None:
    spec = make_spec(tp_size=4, pp_size=2)
    assert severities(check(spec), "dflash-pipeline-parallel") == {"error"}


def test_it_allows_pipeline_parallel_without_speculation() -> None:
    spec = make_spec(tp_size=4, pp_size=2, speculative_algorithm="NONE",
                     speculative_ddtree_budget=None)
    assert not by_rule(check(spec), "dflash-pipeline-parallel")


# ---- block-size-agreement

def test_it_rejects_draft_tokens_and_block_size_that_differ() -> None:
    spec = make_spec(speculative_dflash_block_size=16)
    findings = by_rule(check(spec, drafter_config=dflash_config(16)), "block-size-agreement")
    assert any(f.field == "engine.speculative_dflash_block_size" for f in findings)


def test_it_rejects_a_block_larger_than_the_drafter_was_trained_for() -> None:
    findings = check(make_spec(speculative_num_draft_tokens=16), drafter_config=dflash_config(8))
    assert severities(findings, "block-size-agreement") == {"error"}


def test_it_reads_the_block_size_nested_in_dflash_config() -> None:
    drafter = dflash_config(16)
    drafter["dflash_config"]["block_size"] = drafter.pop("block_size")
    findings = check(make_spec(speculative_num_draft_tokens=8), drafter_config=drafter)
    assert severities(findings, "block-size-agreement") == {"warning"}


def test_it_requires_an_explicit_block_size_for_ddtree_on_the_pr_source() -> None:
    findings = check(make_spec(speculative_num_draft_tokens=None), recipe=source_recipe("101"))
    assert severities(findings, "block-size-agreement") == {"error"}


def test_it_lets_a_source_that_reads_the_drafter_infer_the_ddtree_block_size() -> None:
    for short in ("398", "433"):
        findings = check(make_spec(speculative_num_draft_tokens=None), recipe=source_recipe(short))
        assert severities(findings, "block-size-agreement") == {"info"}


def test_it_stays_quiet_when_all_block_sizes_agree() -> None:
    assert not by_rule(check(make_spec(speculative_dflash_block_size=8)), "block-size-agreement")


# ---- parallel-gpu-count

def test_it_rejects_more_parallel_ranks_than_gpus() -> None:
    (finding,) = by_rule(check(make_spec(gpus=4)), "parallel-gpu-count")
    assert finding.severity == "error" and "= 8" in finding.message and "4 assigned" in finding.message


def test_it_warns_about_idle_gpus() -> None:
    assert severities(check(make_spec(tp_size=4)), "parallel-gpu-count") == {"warning"}


def test_it_counts_attention_dp_inside_the_tp_group() -> None:
    spec = make_spec(speculative_algorithm="NONE", speculative_ddtree_budget=None,
                     enable_dp_attention=True, dp_size=8)
    assert not by_rule(check(spec), "parallel-gpu-count")


# ---- tp-divides-model

def test_it_rejects_a_tp_size_that_does_not_divide_the_heads() -> None:
    findings = check(make_spec(tp_size=6, gpus=6))
    assert any("64 attention heads" in f.message for f in by_rule(findings, "tp-divides-model"))


def test_it_rejects_an_ep_size_that_does_not_divide_the_experts() -> None:
    config = kimi_config()
    config["n_routed_experts"] = 100
    findings = check(make_spec(ep_size=8), model_config=config)
    assert any("100 routed experts" in f.message for f in by_rule(findings, "tp-divides-model"))


def test_it_stays_quiet_when_tp_and_ep_divide_kimi() -> None:
    assert not by_rule(check(make_spec(ep_size=8)), "tp-divides-model")


# ---- drafter-matches-target

def test_it_rejects_a_drafter_with_another_vocabulary() -> None:
    drafter = dflash_config()
    drafter["vocab_size"] = 151936
    findings = by_rule(check(make_spec(), drafter_config=drafter), "drafter-matches-target")
    assert any("vocab_size 151936" in f.message for f in findings)


def test_it_rejects_target_layer_ids_beyond_the_targets_layers() -> None:
    drafter = dflash_config()
    drafter["dflash_config"]["target_layer_ids"] = [1, 35, 70]
    drafter["num_target_layers"] = 80
    findings = by_rule(check(make_spec(), drafter_config=drafter), "drafter-matches-target")
    assert any("[70]" in f.message for f in findings)
    assert {f.severity for f in findings} == {"error", "warning"}


def test_it_stays_quiet_for_the_matching_drafter() -> None:
    assert not by_rule(check(make_spec()), "drafter-matches-target")


# ---- gpu-memory

def test_it_rejects_weights_that_do_not_fit_the_gpus() -> None:
    findings = check(make_spec(), weights_bytes=1200 * GB, gpu_memory_gb=141)
    assert severities(findings, "gpu-memory") == {"error"}


def test_it_warns_when_little_room_is_left_for_kv_cache() -> None:
    findings = check(make_spec(), weights_bytes=8 * 124 * GB, gpu_memory_gb=141)
    assert severities(findings, "gpu-memory") == {"warning"}


def test_it_reports_the_kv_room_when_kimi_fits_on_eight_h200s() -> None:
    findings = check(make_spec(), weights_bytes=595 * GB, gpu_memory_gb=141)
    assert severities(findings, "gpu-memory") == {"info"}


def test_it_stays_quiet_about_memory_when_the_gpu_is_unknown() -> None:
    assert not by_rule(check(make_spec(), weights_bytes=595 * GB), "gpu-memory")


def test_it_reads_the_checkpoint_index_and_configs_from_local_paths(tmp_path: Path) -> None:
    model, drafter = tmp_path / "kimi", tmp_path / "drafter"
    model.mkdir()
    drafter.mkdir()
    (model / "config.json").write_text(json.dumps(kimi_config()))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1200 * GB}, "weight_map": {}}))
    (drafter / "config.json").write_text(json.dumps(dflash_config(16)))
    spec = make_spec(model_path=str(model), speculative_draft_model_path=str(drafter))
    findings = run_preflight(spec, gpu_memory_gb=141)
    assert severities(findings, "gpu-memory") == {"error"}
    assert severities(findings, "block-size-agreement") == {"warning"}


# ---- unknown-flag

def test_it_flags_an_unknown_extra_arg_with_the_closest_flag() -> None:
    (finding,) = by_rule(check(make_spec(extra_args=["--cuda-graph-max-bz", "8"])),
                         "unknown-flag")
    assert finding.field == "extra_args[0]" and "--cuda-graph-max-bs" in finding.fix


def test_it_flags_an_engine_field_the_recipes_sglang_lacks() -> None:
    spec = make_spec(speculative_algorithm="NONE", speculative_ddtree_budget=None,
                     cuda_graph_max_bs=16)
    findings = by_rule(check(spec, recipe=load_recipe("kimi-k2.6-baseline")), "unknown-flag")
    assert [f.field for f in findings] == ["engine.cuda_graph_max_bs"]
    assert "--cuda-graph-max-bs-decode" in findings[0].fix


def test_it_accepts_known_extra_args_with_values_and_equals() -> None:
    spec = make_spec(extra_args=["--log-level", "info", "--decode-log-interval=10"])
    assert not by_rule(check(spec), "unknown-flag")


# ---- algorithm-in-source

def test_it_rejects_ddtree_on_a_release_without_it() -> None:
    findings = check(make_spec(), recipe=load_recipe("kimi-k2.6-dflash"))
    assert severities(findings, "algorithm-in-source") == {"error"}


def test_it_accepts_ddtree_on_the_pr_source() -> None:
    assert not by_rule(check(make_spec()), "algorithm-in-source")


# ---- secret-in-args

def test_it_rejects_a_token_in_extra_args() -> None:
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz12"
    findings = check(make_spec(extra_args=["--schedule-policy", "lpm", "--x", token]))
    assert [f.field for f in by_rule(findings, "secret-in-args")] == ["extra_args[3]"]


def test_it_rejects_the_value_of_an_api_key_flag() -> None:
    findings = check(make_spec(extra_args=["--api-key", "letmein"]))
    assert [f.field for f in by_rule(findings, "secret-in-args")] == ["extra_args[1]"]


def test_it_stays_quiet_about_ordinary_args() -> None:
    assert not by_rule(check(make_spec(extra_args=["--log-level", "info"])), "secret-in-args")


# ---- speculative-draft-model, dflash-max-running-requests, cuda-graph-disabled, ...

def test_it_requires_a_draft_model_for_dflash() -> None:
    spec = make_spec(speculative_draft_model_path=None)
    assert severities(check(spec), "speculative-draft-model") == {"error"}


def test_it_does_not_require_a_draft_model_without_speculation() -> None:
    spec = make_spec(speculative_algorithm="NONE", speculative_draft_model_path=None,
                     speculative_ddtree_budget=None)
    assert not by_rule(check(spec), "speculative-draft-model")


def test_it_notes_the_dflash_cap_of_48_running_requests() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None)
    (finding,) = by_rule(check(spec), "dflash-max-running-requests")
    assert "48" in finding.message
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None,
                     max_running_requests=64)
    assert not by_rule(check(spec), "dflash-max-running-requests")


def test_it_warns_that_speculation_without_cuda_graphs_runs_eager() -> None:
    assert severities(check(make_spec(disable_cuda_graph=True)), "cuda-graph-disabled") == \
        {"warning"}
    assert not by_rule(check(make_spec()), "cuda-graph-disabled")


def test_it_requires_the_overlap_scheduler_off_for_ddtree_on_the_pr_source() -> None:
    spec = make_spec(disable_overlap_schedule=False)
    (finding,) = by_rule(check(spec, recipe=source_recipe("101")), "ddtree-overlap-schedule")
    assert finding.severity == "error" and "DDTREE does not support overlap" in finding.message
    assert not by_rule(check(make_spec(), recipe=source_recipe("101")), "ddtree-overlap-schedule")


def test_it_notes_the_source_that_turns_the_overlap_scheduler_off_itself() -> None:
    spec = make_spec(disable_overlap_schedule=False)
    assert severities(check(spec, recipe=source_recipe("398")), "ddtree-overlap-schedule") == \
        {"info"}


def test_it_lets_ddtree_v2_overlap_and_notes_when_it_is_turned_off() -> None:
    on = make_spec(disable_overlap_schedule=False)
    assert not by_rule(check(on, recipe=source_recipe("433")), "ddtree-overlap-schedule")
    assert severities(check(make_spec(), recipe=source_recipe("433")),
                      "ddtree-overlap-schedule") == {"info"}


def test_it_warns_about_overlap_on_a_ddtree_source_it_does_not_know() -> None:
    spec = make_spec(disable_overlap_schedule=False)
    assert severities(check(spec, recipe=source_recipe("unknown")),
                      "ddtree-overlap-schedule") == {"warning"}


def test_it_rejects_an_extra_arg_that_repeats_an_engine_field() -> None:
    # An option flag in extra_args becomes the option (appliance.engine.extra_args), so the
    # spec itself refuses one set both ways, naming both.
    with pytest.raises(SpecError) as caught:
        make_spec(extra_args=["--tp-size", "4"])
    (error,) = caught.value.errors
    assert error.field == "extra_args[0]" and "engine.tp_size" in error.message
    twice = ["--schedule-policy", "lpm", "--schedule-policy", "fcfs"]
    (finding,) = by_rule(check(make_spec(extra_args=twice)), "duplicate-flag")
    assert finding.field == "extra_args[2]"
    assert not by_rule(check(make_spec(extra_args=["--log-level", "info"])), "duplicate-flag")


def test_it_requires_trust_remote_code_for_a_model_with_custom_code() -> None:
    assert severities(check(make_spec(trust_remote_code=False)), "trust-remote-code") == \
        {"error"}
    assert not by_rule(check(make_spec()), "trust-remote-code")


def test_it_reports_an_unknown_recipe_as_an_error() -> None:
    spec = spec_from_dict({"name": "t", "recipe": "kimi-k2.6-dtree", "gpus": [0],
                           "engine": {"model_path": "/nonexistent"}})
    findings = run_preflight(spec)
    assert [f.rule for f in findings if f.severity == "error"] == ["recipe"]
    assert has_errors(findings)


def test_every_rule_id_is_stable_and_kebab_case() -> None:
    assert all(rule == rule.lower() and " " not in rule for rule in RULES)
    assert {"ddtree-verify-width", "ddtree-budget", "tree-attention-backend",
            "dflash-dp-attention", "dflash-pipeline-parallel", "block-size-agreement",
            "parallel-gpu-count", "tp-divides-model", "drafter-matches-target", "gpu-memory",
            "unknown-flag", "secret-in-args"} <= set(RULES)


# ---- context-length

def test_it_rejects_a_context_longer_than_the_model_allows_without_speculation() -> None:
    spec = make_spec(speculative_algorithm="NONE", speculative_ddtree_budget=None,
                     context_length=300000)
    assert severities(check(spec), "context-length") == {"error"}


def test_it_only_warns_about_a_longer_context_when_the_override_env_is_set() -> None:
    assert severities(check(make_spec(context_length=300000)), "context-length") == {"warning"}


def test_it_stays_quiet_about_a_context_within_the_models_limit() -> None:
    assert not by_rule(check(make_spec(context_length=131072)), "context-length")


# ---- rules keyed by the SGLang source (appliance.preflight.sources)

def test_a_source_that_captures_budget_plus_one_needs_no_width_patch() -> None:
    for short in ("398", "433"):
        (finding,) = by_rule(check(make_spec(), recipe=source_recipe(short)), "ddtree-verify-width")
        assert finding.severity == "info" and "width 33 (budget+1)" in finding.message


def test_unpatched_pr_source_with_fa3_fails_at_capture_not_at_replay() -> None:
    (finding,) = by_rule(check(make_spec(), recipe=source_recipe("101")), "ddtree-verify-width")
    assert "no attribute 'target_verify_metadata_topk_normal'" in finding.message
    (finding,) = by_rule(check(make_spec(attention_backend="triton"), recipe=unpatched()),
                         "ddtree-verify-width")
    assert "size of tensor a (8) must match the size of tensor b (33)" in finding.message


def test_it_warns_that_an_unknown_source_has_an_unchecked_verify_width() -> None:
    findings = check(make_spec(), recipe=source_recipe("unknown"))
    assert severities(findings, "ddtree-verify-width") == {"warning"}


def test_it_rejects_an_fa3_draft_on_the_pr_source_even_when_inherited() -> None:
    patched = source_recipe("101", ["ddtree-verify-graph-width"])
    (finding,) = by_rule(check(make_spec(), recipe=patched), "ddtree-draft-attention-backend")
    assert finding.severity == "error"
    assert finding.field == "engine.speculative_draft_attention_backend"
    assert "'NoneType' object has no attribute 'page_table'" in finding.message
    assert "taken from attention_backend" in finding.message and "flashinfer" in finding.fix
    spec = make_spec(attention_backend="triton", speculative_draft_attention_backend="fa3")
    assert severities(check(spec, recipe=patched), "ddtree-draft-attention-backend") == {"error"}


@pytest.mark.parametrize("draft", ["flashinfer", "triton"])
def test_it_accepts_a_non_flash_attention_draft_on_the_pr_source(draft: str) -> None:
    spec = make_spec(speculative_draft_attention_backend=draft)
    assert not by_rule(check(spec, recipe=source_recipe("101")), "ddtree-draft-attention-backend")


def test_it_warns_when_the_pr_sources_draft_backend_is_left_to_sglang() -> None:
    spec = make_spec(attention_backend=None)
    findings = check(spec, recipe=source_recipe("101"))
    assert severities(findings, "ddtree-draft-attention-backend") == {"warning"}


def test_an_fa3_draft_is_fine_where_cascade_is_gated_by_role() -> None:
    for short in ("398", "433"):
        spec = make_spec(speculative_draft_attention_backend="fa3")
        assert not by_rule(check(spec, recipe=source_recipe(short)),
                           "ddtree-draft-attention-backend")


def test_the_pr_source_breaks_verify_kv_with_pages_on_any_backend() -> None:
    spec = make_spec(attention_backend="triton", page_size=16)
    (finding,) = by_rule(check(spec, recipe=source_recipe("101")), "ddtree-page-size")
    assert finding.severity == "error" and finding.field == "engine.page_size"
    assert "allocator.alloc" in finding.message and "page_size: 1" in finding.fix
    assert not by_rule(check(make_spec(page_size=1), recipe=source_recipe("101")),
                       "ddtree-page-size")


def test_ddtree_v2_flash_attention_needs_page_size_one_but_triton_does_not() -> None:
    (finding,) = by_rule(check(make_spec(page_size=64), recipe=source_recipe("433")),
                         "ddtree-page-size")
    assert finding.severity == "error" and "requires page_size=1" in finding.message
    assert "triton" in finding.fix
    triton = make_spec(attention_backend="triton", page_size=64)
    assert not by_rule(check(triton, recipe=source_recipe("433")), "ddtree-page-size")
    unset = make_spec(attention_backend=None, page_size=64)
    assert severities(check(unset, recipe=source_recipe("433")), "ddtree-page-size") == \
        {"warning"}


def test_the_ddtree_branch_accepts_pages_with_flash_attention() -> None:
    spec = make_spec(page_size=64)
    assert not by_rule(check(spec, recipe=source_recipe("398")), "ddtree-page-size")


def test_the_flagship_spec_on_ddtree_v2_and_an_h200_host_has_no_errors_or_warnings() -> None:
    findings = check(make_spec(), recipe=source_recipe("433"), host_gpus=host(H200))
    assert not [f for f in findings if f.severity != "info"], findings


# ---- gpu-arch-attention-backend

@pytest.mark.parametrize(("name", "major"), [
    ("NVIDIA H200", 9), ("NVIDIA H100 80GB HBM3", 9), ("NVIDIA GH200 480GB", 9),
    ("NVIDIA B200", 10), ("NVIDIA GB200", 10), ("NVIDIA B300 SXM6 AC", 10),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 12), ("NVIDIA GeForce RTX 5090", 12),
    ("NVIDIA A100-SXM4-80GB", 8), ("NVIDIA L40S", 8), ("Some Future GPU", None),
])
def test_it_reads_the_architecture_from_the_nvml_name(name: str, major: int | None) -> None:
    assert gpu_major({"name": name}) == major


def test_a_reported_compute_capability_wins_over_the_name() -> None:
    assert gpu_major({"name": "NVIDIA H200", "compute_capability": "12.0"}) == 12
    assert gpu_major({"name": "x", "compute_capability": [10, 3]}) == 10


def test_it_rejects_fa3_for_an_mla_model_on_blackwell_naming_the_backend_to_use() -> None:
    for gpu in (B200, RTX_PRO):
        (finding,) = by_rule(check(make_spec(), host_gpus=host(gpu)), "gpu-arch-attention-backend")
        assert finding.severity == "error" and finding.field == "engine.attention_backend"
        assert "FlashAttention v3 Backend requires SM>=80 and SM<=90" in finding.message
        assert finding.fix.startswith("set attention_backend: triton")


def test_it_offers_flashinfer_for_chain_speculation_on_blackwell_datacenter() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None)
    (finding,) = by_rule(check(spec, host_gpus=host(B200)), "gpu-arch-attention-backend")
    assert "flashinfer" in finding.fix


def test_it_rejects_sglangs_flashinfer_default_for_an_mla_tree_on_b200() -> None:
    findings = check(make_spec(attention_backend=None), host_gpus=host(B200))
    (finding,) = by_rule(findings, "gpu-arch-attention-backend")
    assert finding.severity == "error" and "picks flashinfer" in finding.message
    assert not by_rule(check(make_spec(attention_backend=None), host_gpus=host(RTX_PRO)),
                       "gpu-arch-attention-backend")


def test_it_checks_an_explicit_draft_backend_against_the_gpu() -> None:
    spec = make_spec(attention_backend="triton", speculative_draft_attention_backend="fa3")
    (finding,) = by_rule(check(spec, host_gpus=host(B200)), "gpu-arch-attention-backend")
    assert finding.field == "engine.speculative_draft_attention_backend"


def test_it_rejects_blackwell_only_backends_on_hopper() -> None:
    spec = make_spec(speculative_algorithm="NONE", speculative_ddtree_budget=None,
                     attention_backend="trtllm_mla")
    (finding,) = by_rule(check(spec, host_gpus=host(H200)), "gpu-arch-attention-backend")
    assert "Blackwell" in finding.message and "fa3" in finding.fix


@pytest.mark.parametrize("backend", ["fa3", "triton"])
def test_it_accepts_tree_backends_that_run_on_hopper(backend: str) -> None:
    findings = check(make_spec(attention_backend=backend), host_gpus=host(H200))
    assert not by_rule(findings, "gpu-arch-attention-backend")


def test_it_looks_only_at_the_deployments_gpus_and_stays_quiet_without_an_inventory() -> None:
    mixed = host(H200) + [{**B200, "index": 8}]
    assert not by_rule(check(make_spec(), host_gpus=mixed), "gpu-arch-attention-backend")
    assert not by_rule(check(make_spec()), "gpu-arch-attention-backend")
