"""Causes first seen in the real engine's own output on an H200 (tests/fixtures/real-engine):
each needle is a line that engine printed, and each has a recording that test_diagnosis and
test_real_engine_logs check it against."""

from __future__ import annotations

import re
from typing import Any

from appliance.engine.spec import engine_field_names, flag_for
from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.context import ParseContext

_MIN_FRACTION = re.compile(r"Raise --mem-fraction-static above ([\d.]+)")
_FEATURE_DIMS = re.compile(
    r"Expected shape \[N, (\d+)\] \(num_context_features=(\d+), hidden_size=(\d+)\), "
    r"but got shape=\(\d+, (\d+)\)")
# argparse's own refusals, as `sglang serve` (0.5.23) and launch_server print them.
_AMBIGUOUS = re.compile(r"error: ambiguous option: (--[\w-]+)(?:=\S*)? could match (.+)$")
_UNRECOGNIZED = re.compile(r"error: unrecognized arguments: (.+)$")
_BAD_VALUE = re.compile(r"error: argument (--[\w-]+)[^:]*: (.+)$")
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_JIT_HEADERS = re.compile(r"Required header path (\S+) for (\w+) dependency not found")
# The package a missing module comes from, where its name is not the module's (the lock's names).
_PACKAGE_OF = {"cutlass": "nvidia-cutlass-dsl", "flashinfer": "flashinfer-python",
               "sgl_kernel": "sglang-kernel", "xgrammar": "xgrammar"}
# SGLang's default when the spec sets none leaves room for the KV cache and the graphs.
_DEFAULT_FRACTION_LIMIT = 0.95


def _kv_no_memory(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis:
    """The engine names the smallest fraction that leaves any KV cache; below SGLang's own
    default the fix is to drop the override, above it the model needs more GPUs."""
    found = _MIN_FRACTION.search(text)
    minimum = float(found.group(1)) if found else None
    evidence: dict[str, Any] = {"min_mem_fraction_static": minimum}
    if minimum is not None and minimum >= _DEFAULT_FRACTION_LIMIT:
        return Diagnosis(cause.id, cause.summary, "The weights alone fill the GPUs: raise "
                         "Tensor parallel size in the form (spec key engine.tp_size) to spread "
                         "them over more GPUs, or use a quantized model.", evidence)
    return Diagnosis(cause.id, cause.summary, cause.fix, evidence,
                     {"engine.mem_fraction_static": None})


def _spec_key(flag: str) -> str:
    """Where a user sets a flag: its spec key where the form has one, else Extra engine
    arguments (spec key extra_args)."""
    fields = {flag_for(name): name for name in engine_field_names()}
    return f"engine.{fields[flag]}" if flag in fields else "extra_args"


def _flag_refused(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    """The engine's argument parser refused its command line: a flag this build does not have
    (or spells otherwise), or a value it does not take. Nothing was loaded."""
    if found := _AMBIGUOUS.search(text):
        flag, candidates = found.group(1), [c.strip() for c in found.group(2).split(",")]
        where = _spec_key(flag)
        return cause.worded(
            summary=f"This engine build has no {flag}: its argument parser refused it as "
                    f"ambiguous ({flag} could match {', '.join(candidates)}), before loading "
                    "anything.",
            fix=f"Remove {flag} ({where}) and write the flag this build has instead in Extra "
                f"engine arguments (spec key extra_args), e.g. {candidates[0]} with the same "
                "value; the recipe's flag list (pre-flight) names each build's flags.",
            evidence={"flag": flag, "candidates": candidates, "spec_key": where})
    if found := _UNRECOGNIZED.search(text):
        flags = [a for a in found.group(1).split() if a.startswith("--")]
        return cause.worded(
            summary=f"This engine build does not know {', '.join(flags) or found.group(1)}: "
                    "its argument parser refused the command line before loading anything.",
            fix="Remove the flag from Extra engine arguments (spec key extra_args) or the "
                "spec key that sets it, or deploy with a recipe whose engine build has it.",
            evidence={"flags": flags})
    if found := _BAD_VALUE.search(text):
        flag = found.group(1)
        where = _spec_key(flag)
        return cause.worded(
            summary=f"The engine refused the value of {flag}: {found.group(2)}",
            fix=f"Set {flag} ({where}) to a value the engine lists.",
            evidence={"flag": flag, "spec_key": where})
    return None


def _image_lacks(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    """The engine image lacks what its SGLang build imports or JIT-compiles against at start."""
    if found := _JIT_HEADERS.search(text):
        path, dependency = found.groups()
        package = _PACKAGE_OF.get(dependency, dependency)
        return cause.worded(
            summary=f"The engine image has no {dependency} headers ({path}): this SGLang build "
                    "JIT-compiles kernels against them at start (0.5.23's DFLASH sampling "
                    "kernels, whatever --sampling-backend says), and stopped before serving.",
            fix=f"Build the engine image from the recipe (Images page), whose lock installs "
                f"{package} with its data/ headers and the CUDA compiler the JIT needs; an image "
                "of your own must install the recipe's lock as it is.",
            evidence={"missing": dependency, "package": package, "path": path})
    if found := _NO_MODULE.search(text):
        module = found.group(1).split(".")[0]
        package = _PACKAGE_OF.get(module, module)
        return cause.worded(
            summary=f"The engine image has no Python module {module!r}, which this SGLang build "
                    "imports while building the model (0.5.23 imports the CUTLASS DSL for a "
                    "bf16 Qwen3 MLP), and stopped before serving.",
            fix=f"Build the engine image from the recipe (Images page), whose lock pins "
                f"{package}; an image of your own must install the recipe's lock as it is.",
            evidence={"missing": module, "package": package})
    return None


def _drafter_mismatch(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis:
    found = _FEATURE_DIMS.search(text)
    evidence: dict[str, Any] = {}
    if found:
        expected, layers, hidden, got = (int(x) for x in found.groups())
        evidence = {"drafter_hidden_size": hidden, "drafter_target_layers": layers,
                    "expected_features": expected, "target_features": got,
                    "target_hidden_size": got // layers if layers else None}
    return cause.diagnosis(**evidence)


def _torch_native_mla(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
    # Any error inside torch_native is not this cause: the latent-width bmm mismatch is.
    if "Expected size for first two dimensions of batch2 tensor" not in text:
        return None
    return cause.diagnosis(matched="torch_native_backend.py")


RECORDED_CAUSES: tuple[Cause, ...] = (
    Cause(
        "engine-image-lacks-package",
        "The engine image lacks a package its SGLang build needs at start.",
        "Build the engine image from the recipe (Images page): its lock installs every "
        "package the build imports.",
        93,
        ("for flashinfer dependency not found", "No module named 'cutlass'",
         "No module named 'flashinfer'", "No module named 'sgl_kernel'"),
        _image_lacks,
    ),
    Cause(
        "engine-flag-refused",
        "The engine's argument parser refused its command line before loading anything.",
        "Remove the flag or value it names (Extra engine arguments, spec key extra_args, or the "
        "spec key that sets it), or write it as this engine build spells it.",
        98,
        ("error: ambiguous option: ", "error: unrecognized arguments: ", "error: argument --"),
        _flag_refused,
    ),
    Cause(
        "ddtree-capture-hidden-mode",
        "Capturing the target's verify CUDA graph crashed: this DDTree source (101cd5bd0, the "
        "PR head) builds a DDTreeVerifyInput without capture_hidden_mode, which SGLang's "
        "CUDA-graph runner reads from every speculative verify input (cuda_graph_runner.py "
        "line 913, at the first batch size captured). It fails before any request.",
        "Deploy with the kimi-k2.6-ddtree recipe (Recipe in the form), whose pinned source "
        "433c58ed7 captures the DDTree verify graphs; no setting fixes 101cd5bd0 short of "
        "--disable-cuda-graph in Extra engine arguments (spec key engine.disable_cuda_graph), "
        "which runs every verify eagerly and slowly.",
        100,
        ("'DDTreeVerifyInput' object has no attribute 'capture_hidden_mode'",),
    ),
    Cause(
        "kv-cache-no-memory",
        "After loading the weights no GPU memory was left for the KV cache under the "
        "deployment's mem_fraction_static.",
        "Clear --mem-fraction-static (spec key engine.mem_fraction_static) so that SGLang "
        "chooses it, or raise it above the minimum the engine printed; Redeploy with the fix "
        "clears it.",
        95,
        ("leave no GPU memory for the KV cache", "Not enough memory. Please try to increase "
         "--mem-fraction-static", "Memory pool size is too small"),
        _kv_no_memory,
    ),
    Cause(
        "drafter-target-mismatch",
        "The drafter was trained for another target model: it expects the target's hidden "
        "features in another size than this target gives (DFLASH target_hidden feature dim "
        "mismatch, at the first batch after the whole load).",
        "Choose the DFlash drafter made for this target in Draft model path (spec key "
        "engine.speculative_draft_model_path): its config.json hidden_size must equal the "
        "target's, and its dflash_config.target_layer_ids name layers the target has.",
        96,
        ("DFLASH target_hidden feature dim mismatch",),
        _drafter_mismatch,
    ),
    Cause(
        "attention-backend-cannot-run-mla",
        "The torch_native attention backend cannot run Kimi's multi-head latent attention "
        "(its prefill kernel gets the latent 576-wide keys where it expects 192): the engine "
        "fails at its warm-up request, after the load, before any tree is verified.",
        "Set Attention backend in the form (spec key engine.attention_backend) to fa3 on "
        "Hopper or triton on Blackwell, the backends that run MLA and verify DDTree trees.",
        96,
        ("torch_native_backend.py",),
        _torch_native_mla,
        patch={"engine.attention_backend": "fa3"},
    ),
)
