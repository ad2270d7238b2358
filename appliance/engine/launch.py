"""The engine container's command line and environment, from a deployment spec."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.spec import (
    ALWAYS_EMITTED,
    DFLASH_FAMILY,
    DeploymentSpec,
    EngineOptions,
    flag_for,
)


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    secrets: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env), "secrets": list(self.secrets)}


def _engine_argv(engine: EngineOptions) -> list[str]:
    argv: list[str] = []
    defaults = EngineOptions()
    for f in dataclasses.fields(EngineOptions):
        value = getattr(engine, f.name)
        if f.name == "speculative_algorithm" and value == "NONE":
            continue
        if isinstance(value, bool):
            argv += [flag_for(f.name)] if value else []
        elif value is not None and (f.name in ALWAYS_EMITTED or value != getattr(defaults, f.name)):
            argv += [flag_for(f.name), str(value)]
    return argv


def launch_args(spec: DeploymentSpec) -> LaunchPlan:
    """The engine container's argv (a list, never a shell string) and environment."""
    # Clients (and the gateway, which routes by the request's `model`) see the deployment's
    # name unless the spec names the model otherwise; SGLang's default is the model path.
    engine = spec.engine
    if not engine.served_model_name:
        engine = dataclasses.replace(engine, served_model_name=spec.name)
    argv = ["python3", "-m", "sglang.launch_server", *_engine_argv(engine), *spec.extra_args]
    env = dict(spec.env)
    if spec.engine.speculative_algorithm in DFLASH_FAMILY:
        # The drafter config's max_position_embeddings is shorter than the target's; SGLang
        # refuses the target's context length without this.
        env.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    return LaunchPlan(argv=argv, env=env, secrets=list(spec.secrets))
