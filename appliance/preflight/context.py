"""What the pre-flight rules look at (Context), what they report (Finding), and shared helpers.

Also the readers of local checkpoint files (config.json, weight sizes) that fill a Context.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from appliance.engine.recipes import Recipe
from appliance.engine.spec import DeploymentSpec, EngineOptions

if TYPE_CHECKING:
    from appliance.preflight.files import ModelFolder
    from appliance.preflight.store import StoreModel

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    field: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass
class Context:
    """Everything the rules may look at; None where unknown (rules then stay quiet)."""

    spec: DeploymentSpec
    recipe: Recipe | None = None
    model: dict[str, Any] | None = None  # the target's text config
    drafter: dict[str, Any] | None = None
    gpu_memory_gb: float | None = None
    weights_bytes: int | None = None
    drafter_weights_bytes: int | None = None
    flags: frozenset[str] | None = None
    # The host's GPU inventory, one mapping per GPU as NVML reports it (Host.gpu_telemetry
    # "gpus", the self-check's "gpus"): name, index, optionally compute_capability ("9.0").
    host_gpus: list[dict[str, Any]] | None = None
    # What the file system shows of each model path field (appliance.preflight.files), and
    # the names in the engine secret store; None: not looked at, those rules stay quiet.
    model_folders: dict[str, ModelFolder] | None = None
    secret_names: frozenset[str] | None = None
    # What the model store says of each model path field it knows (preflight.store).
    store_models: dict[str, StoreModel] | None = None
    notes: list[Finding] = field(default_factory=list)

    @property
    def engine(self) -> EngineOptions:
        return self.spec.engine

    @property
    def algorithm(self) -> str:
        return self.engine.speculative_algorithm


# ---------------------------------------------------------------- helpers

def text_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """Multimodal checkpoints (Kimi K2.5/K2.6) nest the language model under text_config."""
    if config is None:
        return None
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def is_mla(model: dict[str, Any] | None) -> bool | None:
    if model is None:
        return None
    if model.get("kv_lora_rank"):
        return True
    arch = " ".join(model.get("architectures") or []) + " " + str(model.get("model_type", ""))
    return bool(re.search(r"deepseek_?v[23]|kimi_?k2", arch, re.IGNORECASE))


def drafter_block_size(drafter: dict[str, Any] | None) -> int | None:
    """As sglang's parse_dflash_draft_config: dflash_config.block_size, else top-level."""
    if drafter is None:
        return None
    sub = drafter.get("dflash_config") or {}
    value = sub.get("block_size", drafter.get("block_size"))
    return int(value) if value is not None else None


def block_size(ctx: Context) -> int | None:
    e = ctx.engine
    return e.speculative_num_draft_tokens or e.speculative_dflash_block_size or \
        drafter_block_size(ctx.drafter)


def ddtree_budget(ctx: Context) -> int | None:
    """The PR's rule: --speculative-ddtree-budget, else block size minus 1."""
    if ctx.engine.speculative_ddtree_budget is not None:
        return ctx.engine.speculative_ddtree_budget
    block = block_size(ctx)
    return block - 1 if block else None


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = re.findall(r"\d+", text.split("+")[0])
    return tuple(int(n) for n in nums[:3]) if nums else None


def findings(rule: str, severity: Severity, fld: str, message: str, fix: str) -> list[Finding]:
    return [Finding(rule, severity, fld, message, fix)]


# ---------------------------------------------------------------- local files

def read_config(path: str | None) -> dict[str, Any] | None:
    """config.json of a checkpoint directory when it exists on this machine."""
    if not path:
        return None
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_weights_bytes(path: str | None) -> int | None:
    """Checkpoint size: model.safetensors.index.json metadata.total_size, else the shard sizes."""
    if not path or not Path(path).is_dir():
        return None
    index = Path(path) / "model.safetensors.index.json"
    try:
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int):
            return total
    except (OSError, ValueError):
        pass
    shards = list(Path(path).glob("*.safetensors"))
    return sum(s.stat().st_size for s in shards) if shards else None
