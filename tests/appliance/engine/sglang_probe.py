"""Runs pieces of a real SGLang source tree on the CPU and prints what they compute, as JSON.

Used by test_sglang_source.py in a subprocess (so nothing it registers in sys.modules leaks
into the test process): `python sglang_probe.py <tree>/python`.

SGLang's own package __init__ imports the whole engine (CUDA kernels, transformers, zmq),
so the probe registers bare `sglang` packages whose __path__ is the real tree and imports
only the modules under test; each of those needs just the standard library, numpy and torch.
The one module replaced is arg_groups.overrides (resolved_view: model overrides applied
to server args, the identity for plain arguments), which pulls the engine's utilities.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def bare_packages(python_dir: Path) -> None:
    for name in ("sglang", "sglang.srt", "sglang.srt.arg_groups", "sglang.srt.speculative"):
        module = types.ModuleType(name)
        module.__path__ = [str(python_dir.joinpath(*name.split(".")))]
        sys.modules[name] = module
    overrides = types.ModuleType("sglang.srt.arg_groups.overrides")
    overrides.resolved_view = lambda server_args: server_args  # type: ignore[attr-defined]
    sys.modules[overrides.__name__] = overrides


def flagship_args(**over: Any) -> SimpleNamespace:
    """What launch_server parses for the flagship recipe (only the fields the hook reads)."""
    values = dict(device="cuda", pp_size=1, enable_dp_attention=False,
                  speculative_algorithm="DDTREE", speculative_draft_model_path="/models/drafter",
                  speculative_num_draft_tokens=8, speculative_ddtree_budget=32,
                  speculative_ddtree_block_size=None, speculative_dflash_block_size=None,
                  speculative_ddtree_cuda_graph_buckets=None, speculative_num_steps=None,
                  speculative_eagle_topk=None, speculative_adaptive=False)
    values.update(over)
    return SimpleNamespace(**values)


def server_args_resolution() -> dict[str, Any]:
    """The DDTree half of the source's argument handling (speculative_hook._handle_ddtree).
    Its DFlash half (_handle_dflash, shared with DFLASH and unchanged by DDTree) resolves the
    draft attention backend through the engine's platform utilities, so it is recorded
    rather than run."""
    hook = importlib.import_module("sglang.srt.arg_groups.speculative_hook")
    dflash_calls: list[int] = []
    hook._handle_dflash = lambda a: dflash_calls.append(int(a.speculative_num_draft_tokens))
    args = flagship_args()
    hook._handle_ddtree(args)
    bucketed = flagship_args(speculative_ddtree_cuda_graph_buckets=[8, 16])
    hook._handle_ddtree(bucketed)
    try:
        hook._handle_ddtree(flagship_args(speculative_ddtree_cuda_graph_buckets=[40]))
        too_wide = ""
    except ValueError as exc:
        too_wide = str(exc)
    return {"num_draft_tokens": args.speculative_num_draft_tokens,
            "budget": args.speculative_ddtree_budget, "num_steps": args.speculative_num_steps,
            "topk": args.speculative_eagle_topk,
            "buckets_with_budget": bucketed.speculative_ddtree_cuda_graph_buckets,
            "bucket_too_wide_error": too_wide, "dflash_handled_with_block": dflash_calls}


def verify_widths() -> dict[str, Any]:
    """Tokens per request each role's verify graph is captured for
    (SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify), with the flagship's
    server args published in the source's own runtime context."""
    context = importlib.import_module("sglang.srt.runtime_context")
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    context.get_context().set_server_args(flagship_args())
    widths: dict[str, Any] = {}
    for name in ("DDTREE", "DFLASH", "EAGLE", "NGRAM"):
        algo = spec_info.SpeculativeAlgorithm.from_string(name)
        widths[name] = {
            "target": algo.get_num_tokens_per_req_for_target_verify(8, is_draft_worker=False),
            "draft": algo.get_num_tokens_per_req_for_target_verify(8, is_draft_worker=True)}
    return widths


def tree_and_mask() -> dict[str, Any]:
    import torch

    utils = importlib.import_module("sglang.srt.speculative.ddtree_utils")
    torch.manual_seed(0)
    bs, block, vocab, budget = 2, 8, 64, 32
    logits = torch.randn(bs, block - 1, vocab)
    cpu = torch.device("cpu")
    ids, depths, parents, _children, visibility, sizes, *_ = utils.build_ddtree_tree(
        logits, budget, cpu)
    sizes_list = [int(x) for x in torch.as_tensor(sizes).tolist()]
    past = torch.tensor([5, 9])
    verify_ids, positions, mask, _ = utils.compile_ddtree_tree(
        root_token_ids=torch.tensor([1, 2]), node_token_ids=ids, node_depths=depths,
        visibility=visibility, start_positions=past, past_lengths=past, tree_budget=budget,
        actual_tree_sizes=torch.as_tensor(sizes), device=cpu,
        past_lens_cpu=past.tolist(), actual_sizes_cpu=sizes_list, verify_token_num=budget + 1)
    return {"node_ids_shape": list(ids.shape), "visibility_shape": list(visibility.shape),
            "visibility_dtype": str(visibility.dtype), "tree_sizes": sizes_list,
            "verify_ids_numel": int(verify_ids.numel()), "positions_numel": int(positions.numel()),
            "mask_dtype": str(mask.dtype) if mask is not None else None,
            "mask_numel": int(mask.numel()) if mask is not None else 0,
            "root_first": [int(verify_ids.view(bs, -1)[i, 0]) for i in range(bs)],
            "buckets": utils.resolve_ddtree_cuda_graph_buckets(
                tree_budget=budget, is_ddtree_prune=False),
            "pruned_buckets": utils.resolve_ddtree_cuda_graph_buckets(
                tree_budget=budget, is_ddtree_prune=True)}


def main(argv: list[str]) -> int:
    bare_packages(Path(argv[0]))
    out = {"server_args": server_args_resolution(), "widths": verify_widths(),
           "tree": tree_and_mask()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
