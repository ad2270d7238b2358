"""sglang 0.5.23 (PyPI, the DFLASH and baseline recipes' release) as it really answered, on an
H100 (tests/fixtures/real-engine/0.5.23, made by `tests/gpu/real-engine.sh refusals523`).

The release split --cuda-graph-max-bs into --cuda-graph-max-bs-decode and -prefill, and its
argument parser refuses the old flag as ambiguous: the engine exits 2 before loading anything.
Pre-flight already refused such a spec from the release's flag list (a source reading); the
recording now backs that reading, and the log names the cause if a spec without a flag list
(a site's own source) gets that far.
"""

from __future__ import annotations

import re
from pathlib import Path

from appliance.engine.flags import load_flags
from appliance.engine.recipes import load_recipe
from tests import real_engine as rec
from tests.appliance.preflight.preflight_cases import by_rule, check, make_spec

RELEASE = "0.5.23"
RUN = "flag_ambiguous"
SPLIT = ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]


def _usage_flags() -> set[str]:
    """The flags 0.5.23's own usage text lists (argparse prints each option's first name)."""
    text = "\n".join(line.text for line in rec.lines(RUN, RELEASE))
    usage = text[text.index("usage:"):text.index("error: ambiguous option")]
    return set(re.findall(r"(?:\[|\| )(--[a-z0-9][\w-]*)", usage))


def test_the_release_refuses_the_old_graph_limit_flag_before_loading() -> None:
    info = rec.run_info(RUN, RELEASE)
    assert info["source"] == "sglang-0.5.23" and info["returncode"] == 2
    assert "--cuda-graph-max-bs" in info["argv"]
    assert not rec.of_kind(RUN, "weights_begin", RELEASE)
    assert any("error: ambiguous option: --cuda-graph-max-bs could match "
               "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in line.text
               for line in rec.lines(RUN, RELEASE))


def test_the_panel_names_the_refused_flag_its_spec_key_and_the_releases_spelling() -> None:
    (found,) = [d for d in rec.of_kind(RUN, "diagnosis", RELEASE) if not d.get("severity")]
    assert found["cause"] == "engine-flag-refused"
    assert found["evidence"] == {"flag": "--cuda-graph-max-bs", "candidates": SPLIT,
                                 "spec_key": "engine.cuda_graph_max_bs"}
    assert "engine.cuda_graph_max_bs" in found["fix"] and SPLIT[0] in found["fix"]


def test_pre_flight_refuses_the_same_spec_on_the_release_before_the_load() -> None:
    spec = make_spec(speculative_algorithm="DFLASH", speculative_ddtree_budget=None,
                     speculative_num_draft_tokens=8, cuda_graph_max_bs=32)
    (finding,) = by_rule(check(spec, recipe=load_recipe("kimi-k2.6-dflash")), "unknown-flag")
    assert finding.severity == "error" and finding.field == "engine.cuda_graph_max_bs"
    assert SPLIT[0] in finding.fix


def test_every_flag_the_release_lists_is_in_the_flag_list_pre_flight_reads() -> None:
    listed = load_flags("sglang-0.5.23")
    assert listed is not None
    printed = _usage_flags()
    assert len(printed) > 500, "the usage text was not read"
    assert printed <= listed, sorted(printed - listed)
    assert "--cuda-graph-max-bs" not in printed and set(SPLIT) <= printed


# What the rig's carry left out (it brings 0.5.23's Python, not every package of its lock), the
# release needed at start: recorded as an engine image of one's own would meet it.
IMAGE_LACKS = {
    "dflash_needs_flashinfer_headers": ("flashinfer", "flashinfer-python"),
    "qwen3_needs_cutlass_dsl": ("cutlass", "nvidia-cutlass-dsl"),
}


def test_the_release_stops_before_serving_without_what_its_lock_installs() -> None:
    for run, (missing, package) in IMAGE_LACKS.items():
        info = rec.run_info(run, RELEASE)
        assert info["source"] == "sglang-0.5.23" and info["ready_s"] is None, run
        (found,) = [d for d in rec.of_kind(run, "diagnosis", RELEASE) if not d.get("severity")]
        assert found["cause"] == "engine-image-lacks-package", run
        assert found["evidence"]["missing"] == missing and found["evidence"]["package"] == package
        assert package in found["fix"]


def test_what_the_image_lacked_is_in_the_releases_lock() -> None:
    lock = (Path(__file__).resolve().parents[3] / "appliance" / "engine" / "locks" /
            "sglang-0.5.23.lock.txt").read_text()
    for _, package in IMAGE_LACKS.values():
        assert re.search(rf"^{re.escape(package)}==", lock, re.M), package


def test_dflash_needs_flashinfer_even_with_the_pytorch_sampling_backend() -> None:
    argv = rec.run_info("dflash_needs_flashinfer_headers", RELEASE)["argv"]
    assert argv[argv.index("--sampling-backend") + 1] == "pytorch"
    text = "\n".join(line.text for line in rec.lines("dflash_needs_flashinfer_headers", RELEASE))
    assert "prewarm_sampling" in text and "tree_speculative_sampling_target_only" in text
