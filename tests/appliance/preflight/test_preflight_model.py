"""Pre-flight rules about the model and the GPUs: parallelism, the drafter against the
target, and whether the weights fit."""

from __future__ import annotations

import json
from pathlib import Path

from appliance.preflight import run_preflight
from tests.appliance.preflight.preflight_cases import (
    GB,
    by_rule,
    check,
    dflash_config,
    kimi_config,
    make_spec,
    severities,
)

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


