"""The progress the detail page and the API show, folded from the real engine's events."""

from __future__ import annotations

from typing import Any

from appliance.logs.parser import LogParser
from appliance.runtime.progress import progress_fold
from tests import real_engine as rec


def _folded(texts: list[str]) -> dict[str, Any]:
    progress: dict[str, Any] = {}
    parser = LogParser()
    for text in texts:
        for event in parser.feed(text):
            progress_fold(progress, event.to_dict() | {"kind": event.kind})
    return progress


def test_the_targets_load_time_is_not_overwritten_by_the_drafters() -> None:
    progress = _folded([line.text for line in rec.lines("ddtree_triton")])
    assert progress["weights"]["elapsed_s"] == 0.26
    assert progress["weights"]["model_type"] == "DeepseekV3ForCausalLM"
    assert progress["draft_weights"]["elapsed_s"] == 0.02
    assert progress["draft_weights"]["model_type"] == "DFlashDraftModel"
    assert (progress["weights"]["done"], progress["weights"]["total"]) == (1, 1)


def test_captures_are_one_entry_per_role_with_width_time_and_memory() -> None:
    captures = _folded([line.text for line in rec.lines("ddtree_triton")])["captures"]
    assert [(c["role"], c["mode"], c["num_tokens_per_req"], c["elapsed_s"], c["mem_usage_gb"],
             c["ranks"]) for c in captures] == [
        ("target", "verify", 33, 32.68, 10.0, 1), ("draft", "verify", 8, 30.62, 0.79, 1)]


def _as_rank(text: str, rank: int) -> str:
    # SGLang's scheduler prefix at TP>1 is "[date time TPn] ": the real line, rank added.
    close = text.index("] ")
    return f"{text[:close]} TP{rank}{text[close:]}"


def test_the_tp_ranks_copies_of_a_capture_fold_into_one() -> None:
    # The recording is TP1; at TP8 each rank prints the same lines with its TPn prefix
    # (docs/engine-sources.md). Made from the real lines, eight ranks interleaved by line.
    real = [line.text for line in rec.lines("ddtree_triton")
            if line.text.startswith("[") and ("Load weight" in line.text or "KV Cache" in line.text
                                              or " CUDA graph " in line.text)]
    progress = _folded([_as_rank(text, rank) for text in real for rank in range(8)])
    assert [(c["role"], c["ranks"]) for c in progress["captures"]] == [("target", 8), ("draft", 8)]
    assert progress["weights"]["ranks"] == 8 and progress["weights"]["elapsed_s"] == 0.26
    assert progress["draft_weights"]["ranks"] == 8


def test_each_verify_graphs_real_memory_is_shown_beside_its_width() -> None:
    from web.deployments.models import Deployment
    from web.deployments.selectors import graph_widths

    spec = {"name": "t", "recipe": "kimi-k2.6-ddtree", "gpus": [0],
            "engine": {"model_path": "/models/m", "speculative_algorithm": "DDTREE",
                       "speculative_draft_model_path": "/models/d",
                       "speculative_num_draft_tokens": 8, "speculative_ddtree_budget": 32}}
    progress = _folded([line.text for line in rec.lines("ddtree_triton")])
    rows = graph_widths(deployment=Deployment(spec=spec, progress=progress))
    assert rows == [{"role": "target", "needed": 33, "captured": 33, "mem_usage_gb": 10.0},
                    {"role": "draft", "needed": 8, "captured": 8, "mem_usage_gb": 0.79}]
