"""Pre-flight rules keyed by the SGLang source (appliance.preflight.sources, ddtree,
ddtree_graphs) and by the host's GPU architecture (appliance.preflight.hardware)."""

from __future__ import annotations

import pytest

from appliance.preflight import gpu_major
from tests.appliance.preflight.preflight_cases import (
    B200,
    H200,
    RTX_PRO,
    by_rule,
    check,
    host,
    make_spec,
    severities,
    source_recipe,
    unpatched,
)

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


# ---- ddtree-graph-width, ddtree-fa-verify (433c58ed7: one verify width, fa3 visibility)


def test_pruned_or_bucketed_trees_on_ddtree_v2_verify_eagerly() -> None:
    for extra in (["--is-ddtree-prune"], ["--speculative-ddtree-cuda-graph-buckets", "8", "16"]):
        (finding,) = by_rule(check(make_spec(extra_args=extra)), "ddtree-graph-width")
        assert finding.severity == "warning" and finding.field == "extra_args[0]"
        assert "runs eagerly" in finding.message and extra[0] in finding.fix
    assert not by_rule(check(make_spec()), "ddtree-graph-width")
    # Eager on purpose: nothing to warn about.
    assert not by_rule(check(make_spec(extra_args=["--is-ddtree-prune"],
                                       disable_cuda_graph=True)), "ddtree-graph-width")


def test_more_running_requests_than_captured_batches_verify_eagerly() -> None:
    (finding,) = by_rule(check(make_spec(cuda_graph_max_bs=16)), "ddtree-graph-width")
    assert finding.field == "engine.max_running_requests" and "48" in finding.message
    assert not by_rule(check(make_spec(cuda_graph_max_bs=16, max_running_requests=16)),
                       "ddtree-graph-width")


def test_tree_attention_needs_flash_attention_and_fa3_refuses_the_flashinfer_autotune() -> None:
    (finding,) = by_rule(check(make_spec(extra_args=["--use-tree-attention"],
                                         attention_backend="triton")), "ddtree-fa-verify")
    assert finding.severity == "error" and "requires an FA3/FA4 target" in finding.message
    assert not by_rule(check(make_spec(extra_args=["--use-tree-attention"])), "ddtree-fa-verify")
    for extra in (["--moe-runner-backend", "flashinfer_trtllm"],
                  ["--fp8-gemm-backend=flashinfer_cutlass"]):
        (finding,) = by_rule(check(make_spec(extra_args=extra)), "ddtree-fa-verify")
        assert "requires visibility metadata" in finding.message
        assert finding.field == "extra_args[0]"
        assert not by_rule(check(make_spec(extra_args=extra, attention_backend="triton")),
                           "ddtree-fa-verify")
    assert not by_rule(check(make_spec(extra_args=["--moe-runner-backend", "triton"])),
                       "ddtree-fa-verify")


def test_the_one_width_rules_follow_the_source_not_the_recipe_name() -> None:
    extra = ["--is-ddtree-prune"]
    assert by_rule(check(make_spec(extra_args=extra), source_recipe("433")),
                   "ddtree-graph-width")
    assert not by_rule(check(make_spec(extra_args=extra), source_recipe("398")),
                       "ddtree-graph-width")
