"""CPU-side tests of the GPU self-check: widths, bandwidth, driver rule, no-torch output."""

from __future__ import annotations

import json
from typing import Any

import pytest

from appliance import selfcheck as gpucheck
from appliance.selfcheck import GraphRole
from appliance.selfcheck import cli as gpucheck_cli


def test_ddtree_verifies_budget_plus_one_with_a_tree_and_drafts_at_block_size() -> None:
    roles = gpucheck.graph_roles("DDTREE", block_size=8, budget=32)
    assert roles == [GraphRole("target_verify", 33, "tree"), GraphRole("draft", 8, "full")]


def test_ddtree_without_a_budget_uses_block_minus_one_like_the_pr() -> None:
    verify = gpucheck.graph_roles("ddtree", block_size=16)[0]
    assert verify.width == 16


def test_dflash_verifies_and_drafts_at_block_size() -> None:
    roles = gpucheck.graph_roles("DFLASH", block_size=8)
    assert [(r.role, r.width, r.mask) for r in roles] == [
        ("target_verify", 8, "causal"), ("draft", 8, "full")]


def test_no_speculation_captures_a_one_token_decode_graph() -> None:
    assert gpucheck.graph_roles("NONE") == [GraphRole("decode", 1, "causal")]


def test_explicit_widths_override_the_derived_ones() -> None:
    roles = gpucheck.graph_roles("DDTREE", block_size=8, budget=32, verify_width=40)
    assert roles[0].width == 40 and roles[1].width == 8


@pytest.mark.parametrize("kwargs", [
    {"algorithm": "MEDUSA", "block_size": 8},
    {"algorithm": "DDTREE"},
    {"algorithm": "DDTREE", "block_size": 8, "budget": 0},
    {"algorithm": "DFLASH", "block_size": 0},
])
def test_it_rejects_impossible_algorithm_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        gpucheck.graph_roles(**kwargs)


def test_the_cli_derives_widths_from_algorithm_block_and_budget() -> None:
    args = gpucheck.build_parser().parse_args(
        ["--algorithm", "ddtree", "--block-size", "8", "--budget", "32"])
    assert [r.width for r in gpucheck.roles_from_args(args)] == [33, 8]


def test_bare_widths_give_a_verify_and_a_draft_graph() -> None:
    args = gpucheck.build_parser().parse_args(["--verify-width", "33", "--draft-width", "8"])
    assert [(r.role, r.width) for r in gpucheck.roles_from_args(args)] == [
        ("target_verify", 33), ("draft", 8)]


@pytest.mark.parametrize(("max_bs", "sizes"), [(1, [1]), (4, [1, 2, 4]), (6, [1, 2, 4, 6])])
def test_capture_batch_sizes_are_powers_of_two_up_to_the_max(max_bs: int, sizes: list[int]) -> None:
    assert gpucheck.capture_batch_sizes(max_bs) == sizes


@pytest.mark.parametrize(("world", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_follows_the_nccl_tests_formula(world: int, factor: float) -> None:
    assert gpucheck.bus_bandwidth(100.0, world) == pytest.approx(100.0 * factor)


def test_a_driver_older_than_580_fails_with_a_fix() -> None:
    check = gpucheck.check_driver("570.86.15")
    assert not check.ok and check.id == "driver-too-old"
    assert "580" in check.fix


def test_a_580_driver_passes() -> None:
    assert gpucheck.check_driver("580.159.04").ok


@pytest.mark.parametrize("text", [None, "", "n/a", "580.x"])
def test_an_unreadable_driver_version_fails(text: str | None) -> None:
    assert not gpucheck.check_driver(text).ok


def test_nvml_cuda_versions_read_as_major_minor() -> None:
    assert gpucheck.format_cuda_version(13000) == "13.0"
    assert gpucheck.format_cuda_version(12090) == "12.9"


def test_cuda_visible_devices_is_read_as_a_list_or_none() -> None:
    assert gpucheck.visible_device_ids({}) is None
    assert gpucheck.visible_device_ids({"CUDA_VISIBLE_DEVICES": "4, 5,GPU-ab"}) == [
        "4", "5", "GPU-ab"]


@pytest.mark.parametrize("text", ["", "a,b", "0,0", "-1"])
def test_it_rejects_bad_gpu_lists(text: str) -> None:
    with pytest.raises(SystemExit):
        gpucheck.build_parser().parse_args(["--gpus", text])


def test_a_tree_mask_lets_each_node_see_itself_and_its_ancestors_only() -> None:
    width = 33
    parents = gpucheck.tree_parents(width, seed=3)
    rows = gpucheck.mask_rows("tree", width, seed=3)
    for node in range(width):
        ancestors = {node}
        walk = parents[node]
        while walk >= 0:
            ancestors.add(walk)
            walk = parents[walk]
        assert {j for j, seen in enumerate(rows[node]) if seen} == ancestors


def test_a_causal_mask_is_lower_triangular() -> None:
    rows = gpucheck.mask_rows("causal", 4)
    assert [sum(r) for r in rows] == [1, 2, 3, 4]


def _missing(name: str) -> Any:
    return lambda: (None, f"ModuleNotFoundError: No module named '{name}'")


def test_without_torch_or_nvml_it_prints_failed_checks_as_json_and_exits_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpucheck_cli, "import_torch", _missing("torch"))
    monkeypatch.setattr(gpucheck_cli, "import_nvml", _missing("pynvml"))
    rc = gpucheck.main(["--gpus", "0", "--algorithm", "DDTREE", "--block-size", "8",
                        "--budget", "32", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False
    by_id = {c["id"]: c for c in out["checks"]}
    assert not by_id["torch-available"]["ok"] and "torch" in by_id["torch-available"]["message"]
    assert by_id["torch-available"]["fix"] and by_id["nvml-available"]["fix"]
    assert {"gpus", "topology", "allreduce", "graphs", "elapsed_s"} <= set(out)


def test_the_human_output_names_each_failed_check_and_its_fix(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpucheck_cli, "import_torch", _missing("torch"))
    monkeypatch.setattr(gpucheck_cli, "import_nvml", _missing("pynvml"))
    assert gpucheck.main(["--gpus", "0"]) == 1
    text = capsys.readouterr().out
    assert "FAIL] torch-available" in text and "fix:" in text


def test_bad_widths_exit_two_with_an_arguments_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpucheck.main(["--algorithm", "DDTREE", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["checks"][0]["id"] == "arguments"


def test_the_width_mismatch_reproduction_gives_torch_s_size_error() -> None:
    pytest.importorskip("torch")
    text = gpucheck.reproduce_width_mismatch(8, 33, 1)
    assert "tensor a (8)" in text and "tensor b (33)" in text
