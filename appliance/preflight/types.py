"""The pre-flight's shared types: what the rules look at (Context, with what the file system
and the model store show of each model path: ModelFolder, StoreModel) and what they report
(Finding). The rules' modules import these; none of them imports another for a type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from appliance.engine.recipes import Recipe
from appliance.engine.spec import DeploymentSpec, EngineOptions

# The entry's states (web.store.models.ModelState): the deployment waits for these...
WAITING_STATES = frozenset({"downloading", "verifying"})
# ...and these are never mounted into an engine.
UNUSABLE_STATES = frozenset({"partial", "failed", "cancelled"})


@dataclass(frozen=True)
class ModelFolder:
    """What the file system shows of one model path (the engine's path, as written)."""

    path: str
    mounted: bool  # under the models mount (files.MODELS_MOUNT): the engine can see it
    exists: bool  # a folder by that name in the models folder
    has_config: bool = False
    weight_files: int = 0
    weights_bytes: int = 0
    # Folder names beside it, for a "did you mean" on a typo.
    siblings: tuple[str, ...] = ()
    # It is there, but a symlink leads out of the models folder: never mounted or read.
    escapes: bool = False


@dataclass(frozen=True)
class StoreModel:
    """What the model store says of one model path (the engine's path, as written)."""

    path: str
    entry_id: int | None = None  # None: a folder in a root the store has no entry for
    state: str = ""
    size_bytes: int = 0
    bytes_done: int = 0
    error: str = ""
    read_gbps: float | None = None  # the root's measured sequential read rate


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
    # The host's GPU inventory, one mapping per GPU as NVML reports it (its report's gpu_telemetry
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


def findings(rule: str, severity: Severity, fld: str, message: str, fix: str) -> list[Finding]:
    return [Finding(rule, severity, fld, message, fix)]
