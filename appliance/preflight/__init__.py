"""Pre-flight rules: catch a bad deployment in a second instead of after a 6-minute model load.

Each rule is a small function with a stable id (the key in RULES) and tests for firing and for
staying quiet. Facts come from SGLang 0.5.23's argument handling (arg_groups/speculative_hook.py,
speculative/dflash_utils.py) and from the DDTree sources (101cd5bd0, 398fc2c72, 433c58ed7;
docs/engine-sources.md), keyed by the recipe's source, never its name (preflight.sources).

Rules by concern: speculative (DDTree/DFLASH settings), ddtree (what depends on the SGLang
source: verify width, the draft's attention backend, page size, overlap; the per-source facts are
in sources), hardware (attention backends against the host's GPU architecture), parallelism (GPU
count, tp/ep against the model, drafter vs target), model (custom code, context length, GPU
memory) and arguments (unknown, duplicate and secret flags); context holds Finding, Context, the
shared helpers and the readers of local checkpoint files. RULES below fixes the order
run_preflight runs them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from appliance import selfcheck
from appliance.engine.flags import load_flags
from appliance.engine.model_config import drafter_block_size, is_mla, text_config
from appliance.engine.recipes import Recipe, RecipeError, load_recipe
from appliance.engine.spec import DeploymentSpec
from appliance.preflight.arguments import (
    rule_duplicate_flag,
    rule_secret_in_args,
    rule_unknown_flag,
)
from appliance.preflight.context import block_size, ddtree_budget, read_config, read_weights_bytes
from appliance.preflight.ddtree import (
    VERIFY_WIDTH_PATCH,
    rule_ddtree_draft_attention_backend,
    rule_ddtree_overlap_schedule,
    rule_ddtree_page_size,
    rule_ddtree_verify_width,
)
from appliance.preflight.ddtree_graphs import (
    rule_ddtree_fa_verify_inputs,
    rule_ddtree_graph_width_only,
)
from appliance.preflight.files import (
    MODELS_MOUNT,
    WEIGHT_SUFFIXES,
    rule_model_files,
    rule_secret_in_store,
)
from appliance.preflight.graph_memory import rule_graph_memory
from appliance.preflight.hardware import (
    deployment_archs,
    gpu_major,
    rule_gpu_arch_attention_backend,
)
from appliance.preflight.model import (
    GIB,
    rule_context_length,
    rule_gpu_memory,
    rule_trust_remote_code,
)
from appliance.preflight.parallelism import (
    rule_drafter_matches_target,
    rule_parallel_gpu_count,
    rule_tp_divides_model,
)
from appliance.preflight.speculative import (
    DFLASH_DEFAULT_BLOCK,
    DFLASH_MAX_RUNNING_DEFAULT,
    NEEDS_DRAFT_MODEL,
    TREE_BACKENDS,
    rule_algorithm_in_source,
    rule_block_size_agreement,
    rule_cuda_graph_disabled,
    rule_ddtree_budget,
    rule_dflash_dp_attention,
    rule_dflash_max_running_requests,
    rule_dflash_pipeline_parallel,
    rule_speculative_draft_model,
    rule_tree_attention_backend,
)
from appliance.preflight.store import (
    config_from_summary,
    rule_load_time,
    rule_model_store_state,
)
from appliance.preflight.types import Context, Finding, ModelFolder, Severity, StoreModel

__all__ = [
    "DFLASH_DEFAULT_BLOCK",
    "DFLASH_MAX_RUNNING_DEFAULT",
    "GIB",
    "MODELS_MOUNT",
    "NEEDS_DRAFT_MODEL",
    "RULES",
    "SELF_CHECK_MAX_BS",
    "TREE_BACKENDS",
    "VERIFY_WIDTH_PATCH",
    "WEIGHT_SUFFIXES",
    "Context",
    "Finding",
    "ModelFolder",
    "Severity",
    "StoreModel",
    "block_size",
    "config_from_summary",
    "ddtree_budget",
    "deployment_archs",
    "drafter_block_size",
    "gpu_check_args",
    "gpu_major",
    "has_errors",
    "is_mla",
    "read_config",
    "read_weights_bytes",
    "rule_algorithm_in_source",
    "rule_block_size_agreement",
    "rule_context_length",
    "rule_cuda_graph_disabled",
    "rule_ddtree_budget",
    "rule_ddtree_draft_attention_backend",
    "rule_ddtree_fa_verify_inputs",
    "rule_ddtree_graph_width_only",
    "rule_ddtree_overlap_schedule",
    "rule_ddtree_page_size",
    "rule_ddtree_verify_width",
    "rule_dflash_dp_attention",
    "rule_dflash_max_running_requests",
    "rule_dflash_pipeline_parallel",
    "rule_drafter_matches_target",
    "rule_duplicate_flag",
    "rule_gpu_arch_attention_backend",
    "rule_gpu_memory",
    "rule_load_time",
    "rule_model_files",
    "rule_model_store_state",
    "rule_parallel_gpu_count",
    "rule_secret_in_args",
    "rule_secret_in_store",
    "rule_speculative_draft_model",
    "rule_tp_divides_model",
    "rule_tree_attention_backend",
    "rule_trust_remote_code",
    "rule_unknown_flag",
    "run_preflight",
    "text_config",
]


RULES: dict[str, Callable[[Context], list[Finding]]] = {
    "model-files": rule_model_files,
    "model-store-state": rule_model_store_state,
    "load-time": rule_load_time,
    "secret-missing": rule_secret_in_store,
    "ddtree-verify-width": rule_ddtree_verify_width,
    "ddtree-budget": rule_ddtree_budget,
    "tree-attention-backend": rule_tree_attention_backend,
    "gpu-arch-attention-backend": rule_gpu_arch_attention_backend,
    "ddtree-draft-attention-backend": rule_ddtree_draft_attention_backend,
    "ddtree-page-size": rule_ddtree_page_size,
    "ddtree-overlap-schedule": rule_ddtree_overlap_schedule,
    "ddtree-graph-width": rule_ddtree_graph_width_only,
    "ddtree-fa-verify": rule_ddtree_fa_verify_inputs,
    "algorithm-in-source": rule_algorithm_in_source,
    "dflash-dp-attention": rule_dflash_dp_attention,
    "dflash-pipeline-parallel": rule_dflash_pipeline_parallel,
    "block-size-agreement": rule_block_size_agreement,
    "speculative-draft-model": rule_speculative_draft_model,
    "dflash-max-running-requests": rule_dflash_max_running_requests,
    "cuda-graph-disabled": rule_cuda_graph_disabled,
    "parallel-gpu-count": rule_parallel_gpu_count,
    "tp-divides-model": rule_tp_divides_model,
    "drafter-matches-target": rule_drafter_matches_target,
    "trust-remote-code": rule_trust_remote_code,
    "gpu-memory": rule_gpu_memory,
    "graph-memory": rule_graph_memory,
    "context-length": rule_context_length,
    "unknown-flag": rule_unknown_flag,
    "duplicate-flag": rule_duplicate_flag,
    "secret-in-args": rule_secret_in_args,
}


def _resolve_recipe(spec: DeploymentSpec) -> tuple[Recipe | None, list[Finding]]:
    try:
        return load_recipe(spec.recipe), []
    except RecipeError as exc:
        return None, [Finding("recipe", "error", _recipe_field(e.field), e.message, e.fix)
                      for e in exc.errors]


def _recipe_field(name: str) -> str:
    return "recipe" if name in ("recipe", "") else f"recipe.{name}"


def run_preflight(spec: DeploymentSpec, *, recipe: Recipe | None = None,
                  model_config: dict[str, Any] | None = None,
                  drafter_config: dict[str, Any] | None = None,
                  gpu_memory_gb: float | None = None, read_local_configs: bool = True,
                  weights_bytes: int | None = None,
                  drafter_weights_bytes: int | None = None,
                  host_gpus: Sequence[Mapping[str, Any]] | None = None,
                  model_folders: Mapping[str, ModelFolder] | None = None,
                  secret_names: Iterable[str] | None = None,
                  store_models: Mapping[str, StoreModel] | None = None) -> list[Finding]:
    """Run every rule; with read_local_configs, fill in what the local checkpoints say.

    host_gpus is the host's GPU inventory (NVML entries with name, index and optionally
    compute_capability); without it the GPU architecture rule stays quiet. model_folders
    (model path field -> what the file system shows) and secret_names (the secret store's
    names) feed the file rules; store_models (model path field -> what the model store
    says) the store rules; each stays quiet without its facts.
    """
    found: list[Finding] = []
    e = spec.engine
    if read_local_configs:
        if recipe is None:
            recipe, found = _resolve_recipe(spec)
        model_config = model_config or read_config(e.model_path)
        drafter_config = drafter_config or read_config(e.speculative_draft_model_path)
        weights_bytes = weights_bytes or read_weights_bytes(e.model_path)
        drafter_weights_bytes = drafter_weights_bytes or \
            read_weights_bytes(e.speculative_draft_model_path)
    flag_list = recipe.flag_list_name if recipe else None
    ctx = Context(spec=spec, recipe=recipe, model=text_config(model_config),
                  drafter=drafter_config, gpu_memory_gb=gpu_memory_gb,
                  weights_bytes=weights_bytes, drafter_weights_bytes=drafter_weights_bytes,
                  flags=load_flags(flag_list) if flag_list else None,
                  host_gpus=[dict(g) for g in host_gpus] if host_gpus is not None else None,
                  model_folders=dict(model_folders) if model_folders is not None else None,
                  secret_names=frozenset(secret_names) if secret_names is not None else None,
                  store_models=dict(store_models) if store_models is not None else None)
    for rule in RULES.values():
        found += rule(ctx)
    return found


SELF_CHECK_MAX_BS = 8  # graph replay vs eager at a few batch sizes is enough to find a fault


def gpu_check_args(spec: DeploymentSpec, drafter_config: dict[str, Any] | None = None) -> list[str]:
    """The self-check's arguments for a deployment (appliance.selfcheck, in the container).

    Inside the container the deployment's GPUs are numbered from 0. The graph widths are
    the ones the engine will capture: budget+1 and block size for DDTREE, block size for
    DFLASH. When the block size is unknown here (it comes from the drafter's config and
    the worker cannot read it) the graph checks are skipped rather than guessed.
    """
    e = spec.engine
    ctx = Context(spec=spec, drafter=drafter_config or read_config(e.speculative_draft_model_path))
    args = ["--gpus", ",".join(str(i) for i in range(max(1, len(spec.gpus))))]
    algorithm = e.speculative_algorithm.upper()
    block = block_size(ctx)
    if algorithm in selfcheck.ALGORITHMS and (algorithm == "NONE" or block):
        args += ["--algorithm", algorithm]
        if algorithm != "NONE":
            args += ["--block-size", str(block)]
        if algorithm == "DDTREE":
            args += ["--budget", str(ddtree_budget(ctx))]
    else:
        args.append("--skip-graphs")
    max_bs = min(e.cuda_graph_max_bs or SELF_CHECK_MAX_BS, SELF_CHECK_MAX_BS)
    return args + ["--max-bs", str(max_bs)]


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
