"""The eager-decoding diagnosis states the cause its evidence shows (appliance.logs.
eager_causes): graphs off by the spec (an info note, no failure), batches above the captured
sizes, a verify width mismatch (the recipe is the fix), or none of these (no recipe change).

The lines are the real engine's (tests/fixtures/real-engine/433c58ed7/ddtree_triton): its
server_args line, its capture lines and a decode line, with `cuda graph: False` and, where a
case needs it, one value changed (named in each test)."""

from __future__ import annotations

from typing import Any

from appliance.logs.diagnosis import diagnose
from appliance.logs.eager_causes import RECIPE_FIX
from appliance.logs.parser import LogParser
from tests import real_engine as rec


def _recorded(prefix: str) -> str:
    return next(line.text for line in rec.lines("ddtree_triton") if prefix in line.text)


SERVER_ARGS = _recorded("server_args=ServerArgs(")
CAPTURE = _recorded("Capture target verify CUDA graph begin")
DECODE = next(line.text for line in rec.lines("ddtree_triton")
              if "Decode batch" in line.text and "cuda graph: True" in line.text)
EAGER = DECODE.replace("cuda graph: True", "cuda graph: False")


def _findings(lines: list[str], **parser: Any) -> list[dict[str, Any]]:
    p = LogParser(**parser)
    events = [e for line in lines for e in p.feed(line)] + p.finish()
    return [e.fields for e in events if e.kind == "diagnosis"]


def test_graphs_off_in_the_engines_server_args_is_an_info_note_and_no_failure() -> None:
    # The recorded server_args with disable_cuda_graph=True (the spec's disable_cuda_graph).
    off = SERVER_ARGS.replace("disable_cuda_graph=False", "disable_cuda_graph=True")
    [found] = _findings([off, EAGER])
    assert (found["cause"], found["severity"]) == ("cuda-graphs-disabled", "info")
    assert "off by the spec" in found["summary"] and "speed cost" in found["fix"]
    assert "recipe" not in found["fix"]
    assert diagnose([off, EAGER]) is None


def test_graphs_off_in_the_spec_is_read_without_the_server_args_line() -> None:
    [found] = _findings([EAGER], facts={"disable_cuda_graph": True})
    assert found["cause"] == "cuda-graphs-disabled"


def test_a_batch_above_the_largest_captured_size_is_eager_by_design() -> None:
    running = DECODE.split("#running-req: ", 1)[1].split(",", 1)[0]
    above = EAGER.replace(f"#running-req: {running},", "#running-req: 300,")  # above bs 256
    [found] = _findings([SERVER_ARGS, CAPTURE, above])
    assert (found["cause"], found["severity"]) == ("eager-above-max-bs", "info")
    assert found["evidence"]["max_captured_bs"] == max(
        int(b) for b in CAPTURE.split("bs=[", 1)[1].split("]", 1)[0].split(", "))
    assert "engine.cuda_graph_max_bs" in found["fix"] and "recipe" not in found["fix"]


def test_a_verify_graph_captured_at_another_width_names_both_and_the_recipe() -> None:
    # The recorded capture at 33 wide, against a spec that needs 17 (budget 16).
    width, found = _findings([SERVER_ARGS, CAPTURE, EAGER], needed_widths={"target": 17})
    assert width["cause"] == "graph-width-mismatch"  # at capture time, before any decode
    assert found["cause"] == "silent-eager-verify"
    assert "captured 33 tokens wide and the tree needs 17" in found["summary"]
    assert found["fix"] == RECIPE_FIX


def test_the_needed_width_comes_from_the_engines_own_budget_without_a_spec() -> None:
    narrow = CAPTURE.replace("num_tokens_per_req=33", "num_tokens_per_req=8")  # PR head's
    [found] = _findings([SERVER_ARGS, narrow, EAGER])
    assert "captured 8 tokens wide and the tree needs 33" in found["summary"]


def test_eager_with_the_right_width_or_no_capture_is_no_recipe_change() -> None:
    [right] = _findings([SERVER_ARGS, CAPTURE, EAGER])
    assert right["cause"] == "silent-eager-verify" and "as the tree needs" in right["summary"]
    [none] = _findings([SERVER_ARGS, EAGER])
    assert "no target verify graph was captured" in none["summary"]
    for found in (right, none):
        assert "kimi-k2.6-ddtree" not in found["fix"] and "not shown to be the cause" in \
            found["fix"]
