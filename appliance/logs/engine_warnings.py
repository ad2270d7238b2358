"""Engine warnings that change what runs: findings while the engine starts and serves, with a
severity and a fix, in the same catalogue as the failures (appliance.logs.causes).

Each is a line the pinned source (433c58ed7, docs/engine-sources.md) logs when it ignores a
flag, replaces a backend or turns a feature off; the message is matched as SGLang formats
it, and the values it prints are quoted in the finding. Where the source is:

- dflash-block-size-mismatch: speculative/dflash_worker_v2.py (the drafter's config says
  another block size than speculative_num_draft_tokens; the engine runs the flag's);
- ddtree-block-size-flag-ignored: arg_groups/speculative_hook.py _handle_ddtree (two lines);
- dflash-speculative-param-overridden: speculative_hook.py _handle_dflash (steps, topk);
- draft-attention-backend-replaced: speculative_hook.py _resolve_dflash_draft_attention_backend;
- draft-cuda-graph-disabled: speculative/dflash_worker_v2.py init_cuda_graphs;
- cuda-graph-disabled-by-backend: server_args.py (torch_native, flex attention);
- max-running-requests-reset: speculative_hook.py, every speculative algorithm;
- mixed-chunk-disabled: speculative_hook.py (DFLASH, EAGLE, frozen-KV MTP, ngram);
- overlap-schedule-disabled: arg_groups/overrides.py _pipeline_parallel_overlap_disable;
- speculative-adaptive-disabled, draft-window-ignored: speculative_hook.py;
- ddtree-prepare-block-eager: speculative/ddtree_worker_v2.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.context import ParseContext

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_PRIORITY = 20  # a finding, never a failure's cause (diagnose() passes over them)
Patch = Callable[[dict[str, str]], Mapping[str, Any] | None]


def _warning(cause_id: str, severity: str, needle: str, pattern: str, summary: str,
             fix: str, patch: Patch | None = None) -> Cause:
    """A Cause for one engine warning; summary and fix are formatted with the pattern's named
    groups (the values the engine printed)."""
    compiled = re.compile(pattern)

    def refine(cause: Cause, text: str, ctx: ParseContext | None) -> Diagnosis | None:
        found = compiled.search(text)
        if found is None:
            return None
        values = {k: v for k, v in found.groupdict().items() if v is not None}
        return Diagnosis(cause.id, summary.format(**values), fix.format(**values),
                         {**values, "line_text": found.group(0)},
                         patch(values) if patch else None, severity)

    # The catalogue's own text (`appliance causes`) names the values it will quote.
    return Cause(cause_id, _PLACEHOLDER.sub(r"<\1>", summary), _PLACEHOLDER.sub(r"<\1>", fix),
                 _PRIORITY, (needle,), refine, severity=severity)


def _int(value: str) -> int | None:
    return int(value) if value.isdigit() else None


ENGINE_WARNINGS: tuple[Cause, ...] = (
    _warning(
        "dflash-block-size-mismatch", "warning", "DFLASH block size mismatch",
        r"DFLASH block size mismatch: using speculative_num_draft_tokens=(?P<used>\w+) but "
        r"draft config block_size=(?P<drafter>\w+)\.",
        "The engine runs DFLASH with {used} draft tokens per block, but the drafter was "
        "trained with block size {drafter} (its config.json): it drafts {used}, not the "
        "blocks it learned, and accepts fewer tokens per step.",
        "Set Block size in the form (spec key engine.speculative_num_draft_tokens), now "
        "{used}, to the drafter's block size {drafter}; or choose a drafter trained at "
        "{used} (Drafter path, spec key engine.speculative_draft_model_path).",
        lambda v: {"engine.speculative_num_draft_tokens": _int(v["drafter"])}
        if _int(v["drafter"]) else None,
    ),
    _warning(
        "ddtree-block-size-flag-ignored", "warning", "DDTREE uses --speculative-ddtree-block-size",
        r"DDTREE uses --speculative-ddtree-block-size=(?P<used>\d+) instead of "
        r"--speculative-num-draft-tokens=(?P<ignored>\w+)\.",
        "The engine ignores speculative_num_draft_tokens={ignored}: DDTREE runs with "
        "--speculative-ddtree-block-size={used}.",
        "Give the block size once: remove --speculative-ddtree-block-size from Extra engine "
        "arguments and set Block size in the form (spec key "
        "engine.speculative_num_draft_tokens), now {ignored}, to the one you mean ({used} "
        "runs now).",
    ),
    _warning(
        "ddtree-dflash-block-size-ignored", "warning", "DDTREE ignores conflicting",
        r"DDTREE ignores conflicting --speculative-dflash-block-size=(?P<ignored>\w+); using "
        r"--speculative-ddtree-block-size=(?P<used>\d+)\.",
        "The engine ignores speculative_dflash_block_size={ignored}: DDTREE runs with "
        "--speculative-ddtree-block-size={used}.",
        "Remove speculative_dflash_block_size (spec key engine.speculative_dflash_block_size, "
        "or --speculative-dflash-block-size in Extra engine arguments): DDTREE reads its own "
        "block size ({used} runs now).",
        lambda v: {"engine.speculative_dflash_block_size": None},
    ),
    _warning(
        "dflash-speculative-param-overridden", "info", "DFLASH only supports speculative_",
        r"DFLASH only supports (?P<param>speculative_num_steps|speculative_eagle_topk) == 1; "
        r"overriding (?P=param)=(?P<given>\w+) to 1\.",
        "The engine ignores {param}={given}: DFLASH and DDTREE run with {param} 1.",
        "Remove {param} (spec key engine.{param}, or its flag in Extra engine arguments): "
        "DFLASH always runs one step of one candidate per block.",
        lambda v: {f"engine.{v['param']}": None},
    ),
    _warning(
        "draft-attention-backend-replaced", "warning", "DFLASH draft worker ",
        r"DFLASH draft worker (?:only supports attention_backend in .* for now, but got "
        r"'?(?P<asked>[\w-]+)'?|does not support '(?P<asked2>trtllm_mha)' .*?)\. Falling back "
        r"to '(?P<used>[\w-]+)'\.",
        "The drafter's attention backend was replaced: the engine runs the draft on {used}.",
        "Set speculative_draft_attention_backend (spec key "
        "engine.speculative_draft_attention_backend, or --speculative-draft-attention-backend "
        "in Extra engine arguments) to one the DFlash drafter supports (fa3, triton, "
        "flashinfer, fa4), or Attention backend in the form (spec key engine.attention_backend) "
        "to one of them; {used} runs now.",
    ),
    _warning(
        "draft-cuda-graph-disabled", "warning", "Disable DFLASH draft cuda graph",
        r"Disable DFLASH draft cuda graph because only (?P<free_gb>[\d.]+) GB GPU memory is "
        r"available",
        "The drafter runs without CUDA graphs: only {free_gb} GB of GPU memory was left after "
        "the target, under the 1 GB its graphs need; every draft step runs eagerly.",
        "Leave memory for the draft graphs: lower --mem-fraction-static in Extra engine "
        "arguments (spec key engine.mem_fraction_static), or lower --context-length / "
        "--max-running-requests (engine.context_length, engine.max_running_requests).",
    ),
    _warning(
        "cuda-graph-disabled-by-backend", "warning", "Cuda graph is disabled because of using",
        r"Cuda graph is disabled because of using (?P<backend>torch native|torch Flex) "
        r"(?:Attention|attention) backend",
        "The engine runs without CUDA graphs: the {backend} attention backend cannot be "
        "captured, so every decode pass runs eagerly.",
        "Set Attention backend in the form (spec key engine.attention_backend) to fa3 on "
        "Hopper or triton on Blackwell, which run on CUDA graphs.",
        lambda v: {"engine.attention_backend": "fa3"},
    ),
    _warning(
        "max-running-requests-reset", "info", "Max running requests is reset to",
        r"Max running requests is reset to (?P<limit>\d+) for speculative decoding",
        "The engine serves at most {limit} requests at once: the spec sets no "
        "max_running_requests and SGLang caps speculative decoding at {limit}; more wait in "
        "the queue.",
        "To serve more at once, set --max-running-requests N in Extra engine arguments (spec "
        "key engine.max_running_requests), memory and the CUDA-graph batch sizes permitting.",
    ),
    _warning(
        "mixed-chunk-disabled", "info", "Mixed chunked prefill is disabled because of using",
        r"Mixed chunked prefill is disabled because of using (?P<algorithm>[\w-]+(?: [\w-]+)?) "
        r"speculative decoding",
        "The engine ignores enable_mixed_chunk: mixed chunked prefill is off with {algorithm} "
        "speculative decoding.",
        "Remove --enable-mixed-chunk from Extra engine arguments: it has no effect here.",
    ),
    _warning(
        "overlap-schedule-disabled", "info",
        "Pipeline parallelism is incompatible with overlap schedule",
        r"Pipeline parallelism is incompatible with overlap schedule",
        "The engine runs without the overlap scheduler: pipeline parallelism turns it off.",
        "To overlap the CPU scheduler with the GPU, use TP size in the form (spec key "
        "engine.tp_size) over the GPUs instead of pp_size (engine.pp_size: 1).",
    ),
    _warning(
        "speculative-adaptive-disabled", "info", "speculative_adaptive disabled:",
        r"speculative_adaptive disabled: (?P<reason>.+?)\. Falling back to static",
        "The engine ignores speculative_adaptive ({reason}): it runs fixed speculative "
        "parameters.",
        "Remove --speculative-adaptive from Extra engine arguments: it has no effect here.",
    ),
    _warning(
        "draft-window-ignored", "info", "--speculative-draft-window-size has no effect",
        r"--speculative-draft-window-size has no effect with "
        r"speculative_algorithm=(?P<algorithm>\w+)",
        "The engine ignores --speculative-draft-window-size: {algorithm} does not use it.",
        "Remove --speculative-draft-window-size from Extra engine arguments.",
    ),
    _warning(
        "ddtree-prepare-block-eager", "warning", "DDTREE Triton prepare_block failed",
        r"DDTREE Triton prepare_block failed; using eager path: (?P<error>.+)",
        "DDTree's tree preparation runs on its slower eager path: its Triton kernel failed "
        "({error}).",
        "Read the error the engine printed; a Triton or driver problem on this host (the GPU "
        "self-check) is the usual cause. The deployment serves correctly, more slowly.",
    ),
)
ENGINE_WARNING_IDS = frozenset(cause.id for cause in ENGINE_WARNINGS)
# Every line the parser does not classify passes here. Each warning's message begins with its
# needle (the format string's start, after the log prefix): a first-character test, then one
# anchored match for all of them (a loop over the warnings halved the parser's rate).
_BY_NEEDLE = {needle: cause for cause in ENGINE_WARNINGS for needle in cause.needles}
_FIRST = frozenset(needle[0] for needle in _BY_NEEDLE)
_ANY_NEEDLE = re.compile("|".join(re.escape(n) for n in _BY_NEEDLE))


def match_engine_warning(message: str) -> Diagnosis | None:
    """The finding one engine log line is, if it is one of the warnings above."""
    if message[:1] not in _FIRST:
        return None
    found = _ANY_NEEDLE.match(message)
    if found is None:
        return None
    return _BY_NEEDLE[found.group(0)].match(message, None)
