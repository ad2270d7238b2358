"""GPU architecture rule: the attention backends against the GPUs of the host's inventory.

SGLang's own backend code (433c58ed7 lines; 101cd5bd0 and 398fc2c72 in brackets), under
python/sglang/srt/:
- fa3: `assert (major == 8 and not runner.use_mla_backend) or major == 9`, "FlashAttention
  v3 Backend requires SM>=80 and SM<=90", when the backend is created after the weight load:
  layers/attention/attention_registry.py:201 [:186].
- trtllm_mla, tokenspeed_mla: "... only supported on Blackwell GPUs (SM100/SM12x)":
  arg_groups/overrides.py:1706,1718 [server_args.py:2880].
- trtllm_mha (prefill): "... only supported on Blackwell GPUs (SM100)": server_args.py:4980
  [:2955].
- no backend set, MLA model (_get_default_attn_backend): fa3 on SM90, flashinfer on SM100,
  triton otherwise, SM120 included: server_args.py:4889-4905 [:2793-2809]. FlashInfer's MLA
  backend verifies chains only, so a DDTree tree cannot run there (433c58ed7 raises "DDTREE
  full-tree verify does not support target backend": speculative/ddtree_utils.py:19-95,
  ddtree_worker_v2.py:529-532).
- the draft (DFlash, not MLA) takes --speculative-draft-attention-backend, else the target's
  backend; trtllm_* there falls back to flashinfer, fa3 does not (arg_groups/
  speculative_hook.py:500-541 [speculative/dflash_worker.py:103-139]).
- SM90 = capability major 9 (H100, H200), SM100 = major 10 (B200, GB200, B300), SM120 =
  major 12 (RTX PRO 6000 Blackwell, RTX 50x0): utils/common.py:269-290 [:265-286].
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from appliance.engine.model_config import is_mla
from appliance.engine.spec import DFLASH_FAMILY
from appliance.preflight.types import Context, Finding, findings

RULE = "gpu-arch-attention-backend"
ARCH_NAMES = {8: "Ampere/Ada (SM8x)", 9: "Hopper (SM90)", 10: "Blackwell datacenter (SM100)",
              12: "Blackwell workstation (SM120)"}
# NVML device names -> compute capability major, first match wins (GB200 before B200).
_NAME_MAJOR: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"RTX PRO \d+ Blackwell|RTX 50\d0|\bGB10\b", re.I), 12),
    (re.compile(r"\bG?B[123]00\b", re.I), 10),
    (re.compile(r"\bG?H(100|200|800|20)\b", re.I), 9),
    (re.compile(r"\bA(100|800|10G?|30|40)\b|\bL(4|20|40S?)\b|RTX A\d000|Ada|RTX (30|40)\d0",
                re.I), 8),
)
FA3_ASSERT = ("SGLang asserts 'FlashAttention v3 Backend requires SM>=80 and SM<=90' when it "
              "creates the backend, after the full model load")


def gpu_major(gpu: dict[str, Any]) -> int | None:
    """Compute capability major of one inventory entry: its compute_capability, else its name."""
    cap = gpu.get("compute_capability")
    if isinstance(cap, (list, tuple)) and cap:
        cap = cap[0]
    if isinstance(cap, (int, float, str)) and str(cap).split(".")[0].isdigit():
        return int(str(cap).split(".")[0])
    name = str(gpu.get("name") or "")
    return next((major for pattern, major in _NAME_MAJOR if pattern.search(name)), None)


def deployment_archs(ctx: Context) -> dict[int, str]:
    """Architectures (major -> a GPU name) of the deployment's GPUs in the host inventory."""
    inventory = ctx.host_gpus or []
    indexed = [g for g in inventory if isinstance(g.get("index"), int)]
    chosen: Iterable[dict[str, Any]] = (
        [g for g in indexed if g["index"] in ctx.spec.gpus] if indexed else inventory)
    archs: dict[int, str] = {}
    for gpu in chosen:
        major = gpu_major(gpu)
        if major is not None:
            archs.setdefault(major, str(gpu.get("name") or f"SM{major}x"))
    return archs


def _unsupported(backend: str, major: int, mla: bool | None) -> str | None:
    if backend == "fa3" and not (major == 9 or (major == 8 and mla is not True)):
        return FA3_ASSERT
    if backend in ("trtllm_mla", "tokenspeed_mla") and major not in (10, 11, 12):
        return f"SGLang raises '{backend} ... is only supported on Blackwell GPUs (SM100/SM12x)'"
    if backend == "trtllm_mha" and major != 10:
        return "SGLang raises 'TRTLLM MHA backend for prefill is only supported on Blackwell " \
            "GPUs (SM100)'"
    return None


def _advice(ctx: Context, major: int, mla: bool | None) -> str:
    tree = ctx.algorithm == "DDTREE"
    if major == 9:
        return "fa3 (or triton)"
    if not mla:
        return "flashinfer (or triton)"
    if major == 10 and not tree:
        return "flashinfer (SGLang's choice for MLA on SM100) or triton"
    return "triton (the backend that verifies a tree on MLA models off Hopper)" if tree \
        else "triton (SGLang's choice for MLA off Hopper and SM100)"


def _target(ctx: Context, major: int, gpu: str) -> list[Finding]:
    backend, mla, fld = ctx.engine.attention_backend, is_mla(ctx.model), "engine.attention_backend"
    where = f"{gpu}, {ARCH_NAMES.get(major, f'SM{major}x')}"
    if backend is None:
        if ctx.algorithm == "DDTREE" and mla and major == 10:
            return findings(RULE, "error", fld,
                            f"no attention backend set: on {where} SGLang picks flashinfer for "
                            "an MLA model, and FlashInfer's MLA backend verifies chains only, "
                            "not DDTree's tree",
                            f"set attention_backend: {_advice(ctx, major, mla)}")
        return []
    reason = _unsupported(backend, major, mla)
    if reason is None:
        return []
    return findings(RULE, "error", fld, f"attention_backend {backend!r} does not run on {where}: "
                    f"{reason}", f"set attention_backend: {_advice(ctx, major, mla)}")


def _draft(ctx: Context, major: int, gpu: str) -> list[Finding]:
    draft = ctx.engine.speculative_draft_attention_backend
    if ctx.algorithm not in DFLASH_FAMILY or draft != "fa3" or major in (8, 9):
        return []
    return findings(RULE, "error", "engine.speculative_draft_attention_backend",
                    f"speculative_draft_attention_backend 'fa3' does not run on {gpu} "
                    f"({ARCH_NAMES.get(major, f'SM{major}x')}): {FA3_ASSERT}",
                    "set speculative_draft_attention_backend: flashinfer (or triton)")


def rule_gpu_arch_attention_backend(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    for major, gpu in sorted(deployment_archs(ctx).items()):
        found += _target(ctx, major, gpu) + _draft(ctx, major, gpu)
    return found
