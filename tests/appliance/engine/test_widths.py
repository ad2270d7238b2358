"""The graph widths a deployment needs per role, from its engine options."""

from __future__ import annotations

from appliance.engine.spec import EngineOptions
from appliance.engine.widths import needed_graph_widths


def test_ddtree_needs_budget_plus_one_for_the_target_and_the_block_for_the_draft() -> None:
    engine = EngineOptions(model_path="/m", speculative_algorithm="DDTREE",
                           speculative_num_draft_tokens=8, speculative_ddtree_budget=32)
    assert needed_graph_widths(engine) == {"target": 33, "draft": 8}
    engine.speculative_ddtree_budget = None
    assert needed_graph_widths(engine) == {"target": 8, "draft": 8}, "budget defaults to block-1"


def test_dflash_needs_the_block_for_both_and_nothing_is_checked_otherwise() -> None:
    dflash = EngineOptions(model_path="/m", speculative_algorithm="DFLASH",
                           speculative_num_draft_tokens=8)
    assert needed_graph_widths(dflash) == {"target": 8, "draft": 8}
    assert needed_graph_widths(EngineOptions(model_path="/m")) is None
    dflash.disable_cuda_graph = True
    assert needed_graph_widths(dflash) is None
    unknown_block = EngineOptions(model_path="/m", speculative_algorithm="DDTREE")
    assert needed_graph_widths(unknown_block) is None
