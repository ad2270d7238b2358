"""What each DDTree-capable SGLang source does with the settings DDTree depends on.

Rules look a source up by what the recipe pins (its git commit, or its flag list name),
never by the recipe's name, so a site recipe that pins the same source gets the same checks.
Paths below are under python/sglang/srt/ of each source at its commit (docs/engine-sources.md).

101cd5bd0 (PR #27509 head)
- verify graph width: captured at the block size; our ddtree-verify-graph-width patch
  widens the target to budget+1 (model_executor/cuda_graph_runner.py, manifest.yaml).
- draft FlashAttention: forward_extend turns cascade on whenever
  `forward_batch.spec_algorithm.is_ddtree()` (layers/attention/flashattention_backend.py:
  859-869), init_forward_metadata likewise (:495-500), and the draft runner is DDTREE too
  (capture: cuda_graph_runner.py spec_algorithm=self.model_runner.spec_algorithm; eager:
  speculative/ddtree_worker.py:175). The draft's backend is
  --speculative-draft-attention-backend, else the target's (speculative/dflash_worker.py:
  103-106), so fa3 (or fa4, the same class) there crashes.
- overlap: argument handling runs nothing for DDTREE (arg_groups/speculative_hook.py:
  111-118), and create_worker raises "DDTREE does not support overlap scheduling
  (spec v2)." (speculative/spec_info.py:183-187).
- page size: DDTreeVerifyInput.prepare_for_verify takes the verify slots with
  `allocator.alloc(bs * q_len)` (speculative/ddtree_info.py:31-45); a paged pool hands
  out whole pages only (mem_cache/allocator/paged.py:122-140), so page_size > 1 breaks.
- block size: not inferred from the drafter (no DDTREE argument handling, above).

398fc2c72 (Rancy-Wang branch ddtree)
- target verify captured at budget+1 (cuda_graph_runner.py:524-543); draft captured with
  its DFlash input (:1504-1519); cascade keyed on the DDTree verify input type
  (flashattention_backend.py:276-292), so the draft may run on fa3.
- overlap: _handle_ddtree turns it off itself (arg_groups/speculative_hook.py:434-438).
- page size: verify allocates paged slots (speculative/ddtree_info.py:210-236) and compacts
  paged KV (:675-700); no FlashAttention page constraint.
- block size: inferred from the drafter's config when unset (speculative_hook.py:364-397).

433c58ed7 (Rancy-Wang branch ddtree-v2, the DFlash v2 runtime)
- target-only verify width budget+1 (speculative/spec_info.py:231-237, used by the graph
  runners and backends); FlashAttention uses cascade only for the DDTree verify input with
  --use-tree-attention (layers/attention/flashattention_backend.py:334-347).
- overlap: the V2 worker runs with and without it (speculative/spec_info.py:254-271).
- page size: FlashAttention tree verify raises "DDTREE one-pass FlashAttention verify
  currently requires page_size=1." (flashattention_backend.py:437-440; cascade :362-365),
  reached while capturing the target verify graph; triton and flashinfer take any page size.
- block size: _handle_ddtree runs DFLASH's handling, which infers it (speculative_hook.py:
  268-304, 210-243).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from appliance.engine.recipes import Recipe

Overlap = Literal["raises", "turned-off", "supported"]
# Backends that are SGLang's FlashAttentionBackend (fa4 is the same class, fa_impl_ver=4).
FLASH_ATTENTION = ("fa3", "fa4")


@dataclass(frozen=True)
class DDTreeSource:
    commit: str
    needs_width_patch: bool  # target verify graph captured at the block size
    draft_fa_cascade: bool  # FlashAttention's DDTree cascade also fires for the draft
    overlap: Overlap
    paged_verify: bool  # verify allocates and frees KV correctly with page_size > 1
    fa_page_size_one: bool  # FlashAttention tree verify raises unless page_size == 1
    infers_block_size: bool  # argument handling reads the block size from the drafter

    @property
    def short(self) -> str:
        return self.commit[:9]

    @property
    def key(self) -> str:
        """The flag list stem this source's flags ship under (appliance/engine/data/)."""
        return f"sglang-ddtree-{self.short}"


DDTREE_SOURCES = (
    DDTreeSource("101cd5bd02faab336ada94f78daada6288c1816e", needs_width_patch=True,
                 draft_fa_cascade=True, overlap="raises", paged_verify=False,
                 fa_page_size_one=False, infers_block_size=False),
    DDTreeSource("398fc2c7261af88b93b772ab1c9d6c4dba612745", needs_width_patch=False,
                 draft_fa_cascade=False, overlap="turned-off", paged_verify=True,
                 fa_page_size_one=False, infers_block_size=True),
    DDTreeSource("433c58ed70cd1dabe5a07a83da12f1513cd599ae", needs_width_patch=False,
                 draft_fa_cascade=False, overlap="supported", paged_verify=True,
                 fa_page_size_one=True, infers_block_size=True),
)


def ddtree_source(recipe: Recipe | None) -> DDTreeSource | None:
    """The known DDTree source a recipe builds, by its source key (the commit's first 9 hex
    digits, from git or a local archive) or, failing that, by its flag list name."""
    if recipe is None:
        return None
    key, flags = recipe.source_key, recipe.flag_list_name
    return next((s for s in DDTREE_SOURCES if key == s.short or flags == s.key), None)
