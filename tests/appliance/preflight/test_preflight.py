"""Pre-flight rules: each fires on a bad deployment and stays quiet on a good one."""

from __future__ import annotations

import pytest

from appliance.engine.recipes import load_recipe
from appliance.engine.spec import SpecError, spec_from_dict
from appliance.preflight import RULES, has_errors, run_preflight
from tests.appliance.preflight.preflight_cases import (
    by_rule,
    check,
    dflash_config,
    kimi_config,
    make_spec,
    severities,
    source_recipe,
    unpatched,
)


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
