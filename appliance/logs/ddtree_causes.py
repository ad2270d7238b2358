"""The DDTree part of the failure catalogue: what the DDTree sources really raise.

Texts are PyTorch's and Python's (checked against torch 2.13: the broadcast check of
`copy_`/`_foreach_copy_`, `torch.where`'s condition dtype check, `expand`'s rank check) at the
places the sources raise them (python/sglang/srt/ of each source at its commit; 101cd5bd0 lines
with our ddtree-verify-graph-width patch applied, unpatched in brackets):
- draft capture: layers/attention/flashattention_backend.py:1032 [1023] forward_extend reads
  `self.forward_metadata_spec_decode_expand.page_table` (None for the draft) because cascade is
  gated on spec_algorithm.is_ddtree(); eagerly the same branch indexes the draft's
  custom_mask=None (:595 [586]).
- unpatched fa3 capture: flashattention_backend.py [323] init_forward_metadata_out_graph reads
  `self.target_verify_metadata_topk_normal`, allocated only when topk > 1.
- verify input ids: speculative/ddtree_info.py prepare_for_verify never sets batch.input_ids;
  the graph runner copies them with torch._foreach_copy_ (model_executor/
  cuda_graph_buffer_registry.py:39 via fill_from :448): one bonus token per request into
  bs*(budget+1) slots, silent at bs=1, "size of tensor a (66) ... b (2)" at bs=2.
- verify width (8 vs 33): model_executor/cuda_graph_runner.py replay copying 33*bs rows into
  the 8*bs-row graph buffers.
- tree mask: speculative/ddtree_utils.py compile_ddtree_tree builds a 3-D bf16 additive mask;
  fa3 indexes it as a flat bool mask (flashattention_backend.py:2285-2296 replay, :595-609
  eager: device-side assert or "where expected condition to be a boolean tensor"), triton
  copies it into a flat buffer (layers/attention/triton_backend.py:420, "expand(...): the
  number of sizes provided (1) must be greater or equal to the number of dimensions").
- 433c58ed7: speculative/ddtree_worker_v2.py:529-532 "DDTREE full-tree verify does not
  support target backend ...", the backends ddtree_utils.py:19-95 cannot feed a tree.
"""

from __future__ import annotations

import re
from typing import Any

from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.context import ParseContext

_SIZE_MISMATCH = re.compile(
    r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
    r"at non-singleton dimension (\d+)"
)
# A graph replay copies the live batch into the captured buffers; these frames
# say the mismatch came from there and not from a model bug.
_REPLAY_FRAMES = ("cuda_graph_runner", "graph_runner.py", "in replay")
# The DDTree worker's call into the target for verify (not the draft's forward).
_TARGET_VERIFY = "target_worker.forward_batch_generation"
_BACKEND = re.compile(r"does not support target backend ([\w.]+)")
NEWER_SOURCES = "398fc2c72 or 433c58ed7"


def _per_request(size: int, width: int | None, bs: int | None) -> tuple[int | None, int | None]:
    """Undo the batch factor in a replay size (rows = width * bs)."""
    if width and size % width == 0:
        return width, size // width
    if bs and size % bs == 0:
        return size // bs, bs
    return None, None


def _sizes(text: str) -> tuple[int, int] | None:
    match = _SIZE_MISMATCH.search(text)
    if match is None or not any(frame in text for frame in _REPLAY_FRAMES):
        return None
    return int(match.group(1)), int(match.group(2))


def _verify_width(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    sizes = _sizes(text)
    if sizes is None:
        return None
    a, b = sizes
    captured, bs = _per_request(a, ctx.verify_width if ctx else None, None)
    if captured is None and ctx is not None:
        captured, bs = _per_request(a, None, ctx.last_bs)
    if captured is None or bs is None or b % bs:
        captured, fed, bs = a, b, None  # no batch factor known: report raw sizes
    else:
        fed = b // bs
    evidence = {"size_a": a, "size_b": b, "bs": bs, "captured_width": captured, "fed_width": fed}
    return Diagnosis(cause.id, _width_summary(captured, fed, bs), cause.fix, evidence)


def _width_summary(captured: int, fed: int, bs: int | None) -> str:
    at_bs = f" (rows {captured * bs} vs {fed * bs} at bs={bs})" if bs and bs > 1 else ""
    if fed > captured:
        return (
            f"CUDA graph replay failed: the target verify graph was captured for {captured} "
            f"tokens per request (block size) but DDTree verify feeds {fed} "
            f"(budget {fed - 1} + 1){at_bs}."
        )
    return (
        f"CUDA graph replay failed: the draft graph was captured for {captured} tokens per "
        f"request (DDTree verify width, budget {captured - 1} + 1) but the DFlash draft feeds "
        f"{fed} (block size){at_bs}."
    )


def _verify_input_ids(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    """One token per request fed to the target's verify graph: the ids were never set."""
    sizes = _sizes(text)
    if sizes is None or _TARGET_VERIFY not in text:
        return None
    rows, bs = sizes
    if bs >= rows or rows % bs:
        return None
    width = rows // bs
    summary = (
        f"CUDA graph replay failed: DDTree verify fed 1 token per request into the target's "
        f"{width}-token verify graph (rows {rows} vs {bs} at bs={bs}): prepare_for_verify "
        f"never sets the verify input ids, so verify gets the previous bonus tokens; at bs=1 "
        f"the copy broadcasts that one token into all {width} slots and verifies wrong tokens "
        f"without an error."
    )
    evidence = {"size_a": rows, "size_b": bs, "bs": bs, "captured_width": width, "fed_width": 1}
    return Diagnosis(cause.id, summary, cause.fix, evidence)


def _draft_flash_attention(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    if "flashattention_backend" not in text or "NoneType" not in text:
        return None
    capture = "page_table" in text
    if not capture and "custom_mask" not in text:
        return None
    return cause.diagnosis(path="draft graph capture" if capture else "eager draft forward",
                           phase=ctx.phase if ctx else None)


_MASK_ERRORS = (
    ("where expected condition to be a boolean tensor",
     "fa3 uses it as a boolean mask and torch.where refuses a bfloat16 condition"),
    ("device-side assert triggered",
     "fa3's mask index extraction runs past it (a device-side assert; the CUDA context is "
     "lost)"),
    ("must be greater or equal to the number of dimensions in the tensor",
     "triton copies it into its flat custom-mask buffer, which a 3-D tensor does not fit"),
)


def _mask_format(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    backend = next((b for b in ("flashattention_backend", "triton_backend") if b in text), None)
    if backend is None or "ddtree" not in text.lower():
        return None
    what = next(w for needle, w in _MASK_ERRORS if needle in text)
    summary = (f"DDTree verify cannot read its tree mask: 101cd5bd0 builds a 3-D bfloat16 "
               f"additive mask (0 / -inf) that neither fa3 nor triton reads; {what}.")
    return Diagnosis(cause.id, summary, cause.fix, {"backend": backend})


def _target_backend(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    found = _BACKEND.search(text)
    evidence: dict[str, Any] = {"backend": found.group(1).rstrip(":.") if found else None}
    return cause.diagnosis(**evidence)


DDTREE_CAUSES: tuple[Cause, ...] = (
    Cause(
        "ddtree-verify-input-ids",
        "CUDA graph replay failed: DDTree verify fed one token per request instead of the "
        "tree (the verify input ids were never set).",
        f"Use a source that sets the verify input ids ({NEWER_SOURCES}); on 101cd5bd0 "
        "prepare_for_verify must set batch.input_ids to the tree's tokens.",
        100,
        ("must match the size of tensor b",),
        _verify_input_ids,
    ),
    Cause(
        "graph-width-mismatch",
        "A verify CUDA graph is being captured at another width than this deployment verifies "
        "per request: the first request will crash in graph replay (the size of tensor a "
        "must match the size of tensor b) or verify eagerly, after the whole model load.",
        "Stop it now: use a source that captures the DDTree target at budget+1 and the draft "
        "at the block size (433c58ed7, the kimi-k2.6-ddtree recipe), or add "
        "--disable-cuda-graph to Extra engine arguments (spec key engine.disable_cuda_graph).",
        90,
    ),
    Cause(
        "ddtree-verify-width",
        "CUDA graph replay failed: the verify graph width differs from the DDTree verify width.",
        "Build with the patch ddtree-verify-graph-width (target verify graph width budget+1, "
        f"draft width block size), use a source that captures budget+1 ({NEWER_SOURCES}), or "
        "add --disable-cuda-graph to Extra engine arguments (spec key "
        "engine.disable_cuda_graph).",
        100,
        ("must match the size of tensor b",),
        _verify_width,
    ),
    Cause(
        "ddtree-draft-flash-attention",
        "The DDTree draft crashed in FlashAttention: this source (101cd5bd0) turns cascade "
        "attention on whenever spec_algorithm.is_ddtree(), which is true for the draft runner "
        "too, and the draft has no tree metadata ('NoneType' object has no attribute "
        "'page_table' while capturing its graph).",
        "Add --speculative-draft-attention-backend flashinfer (or triton) to Extra engine "
        "arguments (spec key engine.speculative_draft_attention_backend) and keep fa3 for the "
        f"target, or use a source that gates cascade by role ({NEWER_SOURCES}).",
        100,
        ("object has no attribute 'page_table'", "'NoneType' object is not subscriptable"),
        _draft_flash_attention,
        patch={"engine.speculative_draft_attention_backend": "flashinfer"},
    ),
    Cause(
        "ddtree-fa3-verify-metadata",
        "Capturing the target's verify graph failed in FlashAttention: unpatched 101cd5bd0 "
        "routes the DDTree verify dummy to the tree (topk>1) metadata, which fa3 allocates only "
        "when speculative_eagle_topk > 1 (no attribute 'target_verify_metadata_topk_normal').",
        "Build with the patch ddtree-verify-graph-width (it allocates the tree verify metadata "
        f"for the DDTREE target), or use a source that carries it ({NEWER_SOURCES}).",
        100,
        ("no attribute 'target_verify_metadata_topk_normal'",),
    ),
    Cause(
        "ddtree-tree-mask-format",
        "DDTree verify cannot read its tree mask: this source builds a 3-D bfloat16 additive "
        "mask that neither fa3 nor triton reads.",
        f"Use a source that builds the mask the backends read ({NEWER_SOURCES}: a boolean "
        "request-packed mask, visibility metadata for fa3); no setting fixes it on 101cd5bd0.",
        100,
        tuple(needle for needle, _ in _MASK_ERRORS),
        _mask_format,
    ),
    Cause(
        "ddtree-target-backend",
        "The target's attention backend cannot verify a DDTree tree (433c58ed7 verifies trees "
        "with FlashAttention fa3/fa4, FlashInfer for non-MLA models, and triton).",
        "Set Attention backend in the form (spec key engine.attention_backend) to fa3 on "
        "Hopper, or triton (MLA models on Blackwell: triton; FlashInfer's MLA backend verifies "
        "chains only).",
        95,
        ("DDTREE full-tree verify does not support target backend",),
        _target_backend,
        patch={"engine.attention_backend": "fa3"},
    ),
)
