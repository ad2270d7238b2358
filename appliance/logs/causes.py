"""Catalogue of SGLang deployment failures and the matchers that recognise them.

The messages matched here are the ones SGLang, PyTorch, NCCL, transformers,
huggingface_hub, uvicorn and the NVIDIA container runtime really print (see
tests/appliance/logs/test_diagnosis.py for where each comes from). Each cause has a
stable id, a summary, a fix, a priority (a specific root cause beats a generic
symptom such as an NCCL error on the other ranks) and cheap substring needles
that gate its matcher, so scanning a log stays fast. The causes the DDTree sources
raise are in appliance.logs.ddtree_causes; the Cause and Diagnosis types in
appliance.logs.cause. These are the engine's part of the one failure catalogue
(appliance.logs.catalogue), beside the appliance's own (appliance.logs.appliance_causes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from appliance.logs.cause import Cause, Diagnosis, Refiner
from appliance.logs.context import ParseContext
from appliance.logs.ddtree_causes import DDTREE_CAUSES
from appliance.logs.eager_causes import EAGER_CAUSES
from appliance.logs.engine_warnings import ENGINE_WARNINGS
from appliance.logs.recorded_causes import RECORDED_CAUSES
from appliance.logs.spec_causes import SPEC_CAUSES, model_not_found

__all__ = ["BY_PRIORITY", "CAUSES", "LINE_TRIGGERS", "SELFCHECK_CAUSE", "Cause", "Diagnosis",
           "Refiner"]

_DRIVER_FOUND = re.compile(r"found version (\d+)")
_CUDA_REQ = re.compile(r"cuda>=([\d.]+)")
_OOM_NEEDLES = ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")


def _oom_in(phase: str, frames: tuple[str, ...]) -> Refiner:
    def refine(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
        in_frames = any(frame in text for frame in frames)
        in_phase = ctx is not None and ctx.phase == phase
        if not (in_frames or in_phase):
            return None
        evidence: dict[str, Any] = {"phase": ctx.phase if ctx else None}
        if ctx is not None and ctx.last_bs is not None and phase == "capture":
            evidence["bs"] = ctx.last_bs
        found = cause.diagnosis(**evidence)
        limit = _lower_max_bs(evidence.get("bs")) if phase == "capture" else None
        return replace(found, patch={"engine.cuda_graph_max_bs": limit}) if limit else found

    return refine


def _lower_max_bs(failed_bs: int | None) -> int | None:
    """A graph batch limit below the batch size whose capture ran out of memory (SGLang
    captures the largest first); 16 when the log did not say which; none below 1."""
    if failed_bs is None:
        return 16
    return failed_bs // 2 or None


def _driver(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    found = _DRIVER_FOUND.search(text)
    needed = _CUDA_REQ.search(text)
    evidence: dict[str, Any] = {}
    if found:
        # PyTorch reports the CUDA version the driver supports, e.g. 12080 = 12.8.
        version = int(found.group(1))
        evidence["driver_cuda"] = f"{version // 1000}.{version % 1000 // 10}"
    if needed:
        evidence["required_cuda"] = needed.group(1)
    return cause.diagnosis(**evidence)


def _nccl(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    if "shared memory" in text or "/dev/shm" in text:
        return CAUSES["shm-too-small"].diagnosis(via="nccl")
    return cause.diagnosis(timeout="Watchdog caught collective operation timeout" in text)


def _eager_verify_refine(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    return None  # decided from decode stats in match_decode, never from text


# Found from the self-check's own report (match_selfcheck), never from a traceback.
SELFCHECK_CAUSE = Cause(
    "gpu-selfcheck-failed",
    "The GPU self-check failed before the model load.",
    "Fix what the failed check names; the check reruns at the next deploy.",
    100,
)

_CATALOGUE: Sequence[Cause] = (
    *DDTREE_CAUSES,
    *RECORDED_CAUSES,
    *SPEC_CAUSES,
    *EAGER_CAUSES,
    *ENGINE_WARNINGS,
    Cause(
        "driver-too-old",
        "The NVIDIA driver is too old for the CUDA version of the engine image.",
        "CUDA 13 images need driver 580 or newer: upgrade the host driver, or use a recipe "
        "with a CUDA 12.9 (-cu129) base image.",
        95,
        (
            "driver on your system is too old",
            "driver version is insufficient for CUDA runtime",
            "unsatisfied condition: cuda>=",
            "CUDA driver version is insufficient",
        ),
        _driver,
    ),
    Cause(
        "model-not-found",
        "The model path is not a local model directory and not a valid Hugging Face repo id.",
        "Check Model path in the form (spec key engine.model_path): it must name a folder "
        "under the models folder (/models in the engine, APPLIANCE_MODELS_DIR on the host) "
        "with config.json in it.",
        95,
        (
            "does not appear to have a file named config.json",
            "HFValidationError",
            "Repository Not Found",
            "is not a local folder and is not a valid model identifier",
        ),
        model_not_found,
    ),
    Cause(
        "trust-remote-code",
        "The model ships custom code (Kimi K2.6 does) and trust_remote_code is off.",
        "Set engine.trust_remote_code: true in the spec (the panel's form always sets it).",
        95,
        ("contains custom code which must be executed", "trust_remote_code=True"),
        patch={"engine.trust_remote_code": True},
    ),
    Cause(
        "tokenizer-missing",
        "The tokenizer could not be loaded from the model directory.",
        "Make sure the tokenizer files (tiktoken.model, tokenizer_config.json) are in the "
        "model directory, or add --tokenizer-path PATH to Extra engine arguments (spec key "
        "engine.tokenizer_path); Kimi's tokenizer also needs "
        "trust_remote_code and the tiktoken package.",
        94,
        ("Can't load tokenizer", "No module named 'tiktoken'"),
    ),
    Cause(
        "port-in-use",
        "A port the engine needs is already in use on the host.",
        "Stop what holds the port (an old engine container: `docker ps`), or add --port N "
        "(a free port) to Extra engine arguments (spec key engine.port).",
        95,
        ("ddress already in use", "is not available in", "[Errno 98]"),
    ),
    Cause(
        "dflash-dp-attention",
        "DFlash does not run with DP attention (0.5.23 allows it only with --enable-dp-lm-head).",
        "Remove --enable-dp-attention from Extra engine arguments (spec key "
        "engine.enable_dp_attention: false), or on SGLang 0.5.23 add --enable-dp-lm-head there.",
        95,
        (
            "DFLASH speculative decoding does not support dp attention",
            "DFLASH with dp attention",
        ),
        patch={"engine.enable_dp_attention": False},
    ),
    Cause(
        "dflash-pipeline-parallel",
        "DFlash supports only pp_size == 1.",
        "Remove --pp-size from Extra engine arguments (spec key engine.pp_size: 1) and spread "
        "the model with TP size over the GPUs.",
        95,
        ("DFLASH speculative decoding only supports pp_size == 1",),
        patch={"engine.pp_size": 1},
    ),
    Cause(
        "draft-model-missing",
        "DFlash/DDTree needs a draft model path.",
        "Fill in Drafter path in the form (spec key engine.speculative_draft_model_path) with "
        "the DFlash drafter's folder under the models folder.",
        95,
        ("requires setting --speculative-draft-model-path",),
    ),
    Cause(
        "flashinfer-mla-tree",
        "FlashInfer's MLA backend supports only chain (topk=1) speculative decoding; a tree "
        "verify needs a tree mask.",
        "Set Attention backend in the form to fa3 (Hopper) or triton (spec key "
        "engine.attention_backend) for Kimi/DeepSeek (MLA) models.",
        95,
        ("Flashinfer MLA only supports topk=1",),
        patch={"engine.attention_backend": "fa3"},
    ),
    Cause(
        "cuda-oom-capture",
        "CUDA ran out of memory while capturing CUDA graphs.",
        "Lower the CUDA-graph batch limit: add --cuda-graph-max-bs 16 to Extra engine "
        "arguments (spec key engine.cuda_graph_max_bs), or --mem-fraction-static 0.8 "
        "(engine.mem_fraction_static) to leave room for the graphs.",
        90,
        _OOM_NEEDLES,
        _oom_in("capture", ("Capture cuda graph failed", "def capture", "in capture")),
    ),
    Cause(
        "cuda-oom-load",
        "CUDA ran out of memory while loading the model weights.",
        "The weights do not fit on the GPUs: use more GPUs (GPU ids and TP size in the form), "
        "a quantized checkpoint, or make sure no other process holds GPU memory (nvidia-smi).",
        90,
        _OOM_NEEDLES,
        _oom_in("load", ("load_model", "load_weights", "weight_utils")),
    ),
    Cause(
        "kv-pool-too-small",
        "No memory is left for the KV cache after the weights.",
        "Raise --mem-fraction-static (e.g. 0.9), or lower --context-length or "
        "--max-running-requests, in Extra engine arguments (spec keys engine.mem_fraction_static, "
        "engine.context_length, engine.max_running_requests), or use more GPUs.",
        85,
        ("Not enough memory. Please try to increase --mem-fraction-static", "leaves no room"),
    ),
    Cause(
        "cuda-oom-runtime",
        "CUDA ran out of memory while serving.",
        "Lower --mem-fraction-static, --max-running-requests or --cuda-graph-max-bs in "
        "Extra engine arguments (spec keys engine.mem_fraction_static, "
        "engine.max_running_requests, engine.cuda_graph_max_bs).",
        80,
        _OOM_NEEDLES,
    ),
    Cause(
        "cuda-device-assert",
        "A CUDA kernel failed a device-side assertion (typically an index out of range); the "
        "CUDA context is unusable after it.",
        "The 'Assertion ... failed' line before the traceback names the kernel; rerun with "
        "CUDA_LAUNCH_BLOCKING=1 under env: in the spec (the form's More spec keys) for the real "
        "stack (the traceback may point at a later call).",
        75,
        ("device-side assert triggered", "cudaErrorAssert"),
    ),
    Cause(
        "cuda-graph-capture-failed",
        "CUDA graph capture failed (not for lack of memory).",
        "Redeploy with --disable-cuda-graph in Extra engine arguments (spec key "
        "engine.disable_cuda_graph) to confirm, then report the traceback; a lower "
        "--cuda-graph-max-bs sometimes avoids it.",
        70,
        ("Capture cuda graph failed",),
    ),
    Cause(
        "shm-too-small",
        "The container's shared memory (/dev/shm) is too small for NCCL and the scheduler.",
        "Give the engine a larger /dev/shm: shm_size: \"64g\" in the spec (the form's More "
        "spec keys), or APPLIANCE_ENGINE_SHM_SIZE for every engine.",
        60,
        ("Bus error", "Error while creating shared memory segment", "No space left on device"),
        patch={"shm_size": "64g"},
    ),
    Cause(
        "nccl-failure",
        "A NCCL collective failed between the GPUs.",
        "Check that all GPUs of the deployment are visible and healthy (`appliance "
        "gpu-check`, or keep the GPU self-check on), and redeploy with NCCL_DEBUG: INFO under "
        "env: in the spec (the form's More spec keys) for details.",
        50,
        (
            "NCCL error",
            "ncclSystemError",
            "ncclUnhandledCudaError",
            "ncclInternalError",
            "DistBackendError",
            "Watchdog caught collective operation timeout",
            "NCCL WARN",
        ),
        _nccl,
    ),
    Cause(
        "silent-eager-verify",
        "Speculative decoding runs without CUDA graphs (decode stats say cuda graph: False): "
        "the verify width differs from the captured graph, so SGLang falls back to eager.",
        "Deploy with the kimi-k2.6-ddtree recipe (its source captures the target verify graph "
        "at budget+1), or a recipe with the patch ddtree-verify-graph-width; the CUDA graph "
        "figure on this page then says True.",
        40,
        (),
        _eager_verify_refine,
    ),
    SELFCHECK_CAUSE,
)
CAUSES: dict[str, Cause] = {cause.id: cause for cause in _CATALOGUE}
BY_PRIORITY = sorted(_CATALOGUE, key=lambda cause: -cause.priority)

# Single lines that name a cause without a traceback (uvicorn's bind error,
# NCCL warnings, the container runtime's driver check, SGLang's port wait).
LINE_TRIGGERS: tuple[tuple[str, str], ...] = (
    ("ddress already in use", "port-in-use"),
    ("error: ambiguous option: ", "engine-flag-refused"),
    ("error: unrecognized arguments: ", "engine-flag-refused"),
    ("error: argument --", "engine-flag-refused"),
    ("is in use. Waiting", "port-in-use"),
    ("NCCL WARN", "nccl-failure"),
    ("unsatisfied condition: cuda>=", "driver-too-old"),
    ("driver on your system is too old", "driver-too-old"),
    ("CUDA driver version is insufficient", "driver-too-old"),
)
