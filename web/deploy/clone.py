"""The new-deployment form filled from a deployment's spec: Clone, and Redeploy with the fix
a diagnosis carries (appliance.logs.cause: a spec patch) applied and marked.

The form has inputs for the common keys; every other engine option goes into Extra engine
arguments as its SGLang flag (the spec takes option flags there as engine options, see
appliance.engine.extra_args), and env, secrets, shm_size and restart into More spec keys as
block YAML (one key a line, so a line added to it keeps it valid), so deploying the filled
form gives the same spec back.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from appliance.engine.restart import RestartPolicy
from appliance.engine.spec import EngineOptions, flag_for
from appliance.logs.cause import spec_patched

from .forms import MORE_SPEC_KEYS

# Engine options that have a form input, or that the form always sets.
_FORM_ENGINE_KEYS = frozenset({
    "model_path", "speculative_draft_model_path", "speculative_algorithm",
    "speculative_num_draft_tokens", "speculative_dflash_block_size",
    "speculative_ddtree_budget", "tp_size", "attention_backend", "trust_remote_code",
})
_SPEC_DEFAULTS: dict[str, Any] = {"env": {}, "secrets": [], "shm_size": None,
                                  "restart": dataclasses.asdict(RestartPolicy())}


def _flag_items(name: str, value: Any) -> list[str]:
    if value is True:
        return [flag_for(name)]
    if value is False or value is None:
        return []  # a switch that is off, or unset: nothing to write (the default)
    return [flag_for(name), str(value)]


def _engine_flags(engine: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Engine options the form has no input for, where they differ from the default."""
    items: list[str] = []
    for name, default in defaults.items():
        if name in _FORM_ENGINE_KEYS or engine.get(name, default) == default:
            continue
        items += _flag_items(name, engine.get(name))
    return items


def _more_spec(spec: Mapping[str, Any]) -> str:
    more = {k: spec[k] for k in MORE_SPEC_KEYS
            if spec.get(k) not in (None, _SPEC_DEFAULTS[k])}
    return yaml.safe_dump(more, default_flow_style=False, sort_keys=False).strip() if more else ""


def form_initial(spec: Mapping[str, Any], *,
                 engine_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The form's values for a spec (as stored), under its recipe's engine defaults."""
    engine = spec.get("engine") or {}
    defaults = {**dataclasses.asdict(EngineOptions()), **engine_defaults}
    extra = [*(spec.get("extra_args") or []), *_engine_flags(engine, defaults)]
    return {
        "name": spec.get("name", ""),
        "recipe": spec.get("recipe", ""),
        "model_path": engine.get("model_path") or "",
        "drafter_path": engine.get("speculative_draft_model_path") or "",
        "algorithm": str(engine.get("speculative_algorithm") or "NONE").upper(),
        "block_size": engine.get("speculative_num_draft_tokens")
        or engine.get("speculative_dflash_block_size"),
        "tree_budget": engine.get("speculative_ddtree_budget"),
        "tp_size": engine.get("tp_size") or 1,
        "gpu_ids": ",".join(str(g) for g in spec.get("gpus") or []),
        "attention_backend": engine.get("attention_backend") or "",
        "extra_args": shlex.join(extra),
        "self_check": bool(spec.get("self_check", True)),
        "replicas": spec.get("replicas") or 1,
        "host": spec.get("host") or "",
        "companion": spec.get("companion") or "",
        "more_spec": _more_spec(spec),
    }


@dataclasses.dataclass(frozen=True)
class FilledForm:
    initial: dict[str, Any]
    patch: dict[str, Any]  # the fix applied, spec key -> new value (empty for a clone)
    changed: list[str]  # the form fields the fix changed, to mark on the page


def form_from_deployment(spec: Mapping[str, Any], *, engine_defaults: Mapping[str, Any],
                         patch: Mapping[str, Any] | None = None) -> FilledForm:
    """The form for a Clone (no patch) or a Redeploy with the fix (the diagnosis' patch)."""
    before = form_initial(spec, engine_defaults=engine_defaults)
    if not patch:
        return FilledForm(before, {}, [])
    after = form_initial(spec_patched(spec, patch), engine_defaults=engine_defaults)
    changed = [name for name, value in after.items() if before.get(name) != value]
    return FilledForm(after, dict(patch), changed)
