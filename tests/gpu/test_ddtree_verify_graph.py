"""DDTree verify under a CUDA graph at budget+1, with the flagship source's own tree builder,
verify-input compiler and FA metadata kernel (see ddtree_graph.py). Figures go to $OUT
(ddtree_verify_graph.json) when it is set."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "appliance" / "engine" / "recipes" / "kimi-k2.6-ddtree.yaml"
sys.path.insert(0, str(Path(__file__).parent))


def snapshot() -> Path:
    ref = re.search(r"^\s*ref:\s*([0-9a-f]{40})", RECIPE.read_text(), re.M)
    assert ref, "the flagship recipe pins a commit"
    where = [Path(p) for p in (os.environ.get("APPLIANCE_SGLANG_SRC_DIR"),) if p]
    where += [ROOT.parent / "shared" / "sglang-src", ROOT / "var" / "sglang-src"]
    for folder in where:
        archive = folder / f"sglang-{ref.group(1)}.tar.gz"
        if archive.is_file():
            return archive
    pytest.skip(f"no snapshot of {ref.group(1)[:9]} in {', '.join(map(str, where))}")


@pytest.mark.parametrize("bs", [1, 2])
def test_ddtree_verify_replays_at_width_33_like_eager(bs: int, tmp_path: Path) -> None:
    from ddtree_graph import run

    result = run(snapshot(), tmp_path, bs=bs)
    out = os.environ.get("OUT")
    if out:
        Path(out, f"ddtree_verify_graph_bs{bs}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    assert result["width"] == 33 and result["rows"] == 33 * bs
    # The graph replays the same arithmetic as eager on new trees (fresh ids, positions,
    # visibility and metadata copied into its buffers), so results agree to rounding.
    assert result["max_abs_graph_vs_eager"] < 1e-3
    # fa3's per-row metadata and the packed boolean mask describe the same visibility.
    assert result["max_abs_fa_metadata_vs_dense_mask"] < 1e-2
    assert result["gpu_follow_equals_cpu_follow"]
    assert all(n >= 4 for lens in result["accept_lens"] for n in lens)
