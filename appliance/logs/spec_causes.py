"""Failures whose fix is a value of the spec, named and quoted: which model path does not
exist (the target's or the drafter's), and a container that sees fewer GPUs than
tp_size x pp_size.

Which path failed is read from the error (huggingface_hub and transformers quote it), and
whose it is from the spec's paths when the caller knows the spec (ParseContext.facts), else
from the traceback: 433c58ed7 reads the drafter's config in its speculative argument hook
(arg_groups/speculative_hook.py, _resolve_speculative_algorithm_alias), the target's in
ServerArgs.get_model_config.
"""

from __future__ import annotations

import re
from typing import Any

from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.context import ParseContext

_QUOTED_PATH = (
    # huggingface_hub's validate_repo_id (a path with more than one "/")
    re.compile(r"Repo id must (?:be in the form|use alphanumeric)[^:]*: '(?P<path>[^']*)'"),
    # transformers' cached_files: a local folder without config.json
    re.compile(r"(?P<path>\S+) does not appear to have a file named config\.json"),
    # transformers: neither a folder nor a Hub id
    re.compile(r"'?(?P<path>[^'\s]+)'? is not a local folder and is not a valid model"),
    re.compile(r"Repository Not Found for url: https://huggingface\.co/api/models/"
               r"(?P<path>[^/\s]+/[^/\s]+)"),
)
# Frames of the drafter's config or weights being read (433c58ed7).
_DRAFTER_FRAMES = ("speculative_hook.py", "_resolve_speculative_algorithm_alias",
                   "build_draft_tp_worker", "draft_model_runner", "dflash_worker",
                   "ddtree_worker")
MODEL_NOT_FOUND_NEEDLES = (
    "does not appear to have a file named config.json",
    "HFValidationError",
    "Repo id must be in the form",
    "Repository Not Found",
    "is not a local folder and is not a valid model identifier",
)
_MODELS_FOLDER = ("under the models folder (/models in the engine, APPLIANCE_MODELS_DIR on "
                  "the host) with config.json in it")


def quoted_model_path(text: str) -> str | None:
    """The model path an error names, as the engine was given it."""
    for pattern in _QUOTED_PATH:
        found = pattern.search(text)
        if found:
            return found.group("path")
    return None


def _is_drafters(path: str | None, text: str, ctx: ParseContext | None) -> bool:
    facts = ctx.facts if ctx is not None else {}
    drafter, target = facts.get("speculative_draft_model_path"), facts.get("model_path")
    if path is not None and drafter and path.rstrip("/") == str(drafter).rstrip("/"):
        return not (target and path.rstrip("/") == str(target).rstrip("/"))
    if path is not None and target and path.rstrip("/") == str(target).rstrip("/"):
        return False
    return any(frame in text for frame in _DRAFTER_FRAMES)


def _drafter_not_found(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    path = quoted_model_path(text)
    if not _is_drafters(path, text, ctx):
        return None
    shown = repr(path) if path is not None else "the drafter's path"
    return Diagnosis(
        cause.id,
        f"The drafter's path {shown} is not a local model folder (and not a Hugging Face repo "
        "id): SGLang stopped while reading its arguments, before loading anything. The "
        "target's path is not the one at fault.",
        f"Fix Drafter path in the form (spec key engine.speculative_draft_model_path), now "
        f"{shown}: it must name the DFlash drafter's folder {_MODELS_FOLDER}.",
        {"path": path, "field": "engine.speculative_draft_model_path"})


def model_not_found(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis:
    """The target's path: the catalogue's model-not-found, with the path it quotes."""
    path = quoted_model_path(text)
    if path is None:
        return cause.diagnosis(matched="model path")
    return Diagnosis(
        cause.id,
        f"The model path {path!r} is not a local model folder and not a valid Hugging Face "
        "repo id.",
        f"Fix Model path in the form (spec key engine.model_path), now {path!r}: it must name "
        f"a folder {_MODELS_FOLDER}.",
        {"path": path, "field": "engine.model_path"})


_ORDINAL_NEEDLES = ("invalid device ordinal", "GPU device may be out of range")


def _needed_gpus(facts: dict[str, Any]) -> int | None:
    tp, pp = facts.get("tp_size"), facts.get("pp_size") or 1
    return int(tp) * int(pp) if isinstance(tp, int) else None


def _fewer_gpus(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis:
    facts = ctx.facts if ctx is not None else {}
    ranks = ctx.error_ranks if ctx is not None else {}
    rank = ranks.get("tp")
    # SGLang gives TP rank r the device base_gpu_id + r * gpu_id_step; the first rank whose
    # device is out of range says how many the container sees, at most.
    base, step = int(facts.get("base_gpu_id") or 0), int(facts.get("gpu_id_step") or 1)
    ordinal = facts.get("device_gpu_id")  # the engine's own line on the failure, else derived
    if ordinal is None and rank is not None:
        ordinal = base + rank * step
    needed, gpus = _needed_gpus(facts), facts.get("gpus")
    tp, pp = facts.get("tp_size"), facts.get("pp_size") or 1
    visible = f"at most {ordinal}" if ordinal is not None else "fewer"
    asked = f"tp_size {tp} x pp_size {pp} = {needed} GPUs" if needed else "more GPUs"
    listed = (f"; the spec lists GPUs {gpus} ({len(gpus)})" if isinstance(gpus, list) else "")
    where = f"rank TP{rank} asked for CUDA device {ordinal}" if rank is not None else \
        "a rank asked for a CUDA device"
    summary = (f"The engine container sees fewer GPUs than the deployment uses: {where}, "
               f"which does not exist (torch: invalid device ordinal). It needs {asked} and "
               f"sees {visible}{listed}.")
    if isinstance(gpus, list) and needed is not None and len(gpus) < needed:
        fix = (f"Give it {needed} GPUs in GPU ids in the form (spec key gpus), now {gpus}, or "
               f"lower TP size in the form (spec key engine.tp_size), now {tp}, to "
               f"{len(gpus)}.")
    else:
        fix = (f"GPU ids in the form (spec key gpus{', now ' + str(gpus) if gpus else ''}) "
               f"must list tp_size x pp_size{' = ' + str(needed) if needed else ''} GPUs and "
               f"TP size (spec key engine.tp_size{', now ' + str(tp) if tp else ''}) match "
               "them; when they do, the container was given fewer than listed: check that "
               "the host's NVIDIA runtime exposes them (nvidia-smi on the host, the "
               "deployment's GPU self-check) and that env CUDA_VISIBLE_DEVICES in the spec "
               "(the form's More spec keys) does not hide some.")
    evidence = {"rank": rank, "device_ordinal": ordinal, "visible_at_most": ordinal,
                "gpus": gpus, "tp_size": tp, "pp_size": pp, "needed_gpus": needed}
    for key in ("cuda_visible_devices", "container_cuda_visible_devices"):
        if key in facts:  # None: the container's process had it unset
            evidence[key] = facts[key]
    return Diagnosis(cause.id, summary, fix, evidence)


SPEC_CAUSES: tuple[Cause, ...] = (
    Cause(
        "drafter-not-found",
        "The drafter's path is not a local model folder and not a valid Hugging Face repo id.",
        "Fix Drafter path in the form (spec key engine.speculative_draft_model_path): it must "
        f"name the DFlash drafter's folder {_MODELS_FOLDER}.",
        96,  # tried before model-not-found, which has the same needles
        MODEL_NOT_FOUND_NEEDLES,
        _drafter_not_found,
    ),
    Cause(
        "fewer-gpus-visible",
        "The engine container sees fewer GPUs than tp_size x pp_size: a rank's CUDA device "
        "does not exist (invalid device ordinal).",
        "GPU ids in the form (spec key gpus) must list tp_size x pp_size GPUs, and TP size "
        "(spec key engine.tp_size) match them; when they do, check that the host's NVIDIA "
        "runtime exposes them all and that env CUDA_VISIBLE_DEVICES in the spec does not "
        "hide some.",
        97,  # the NCCL errors it causes on the other ranks come after
        _ORDINAL_NEEDLES,
        _fewer_gpus,
    ),
)
