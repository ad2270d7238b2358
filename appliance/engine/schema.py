"""JSON Schema of a deployment spec, from EngineOptions' fields (for forms and API docs)."""

from __future__ import annotations

from typing import Any

from appliance.engine.spec import (
    DEPLOYMENT_NAME,
    SPECULATIVE_ALGORITHMS,
    EngineOptions,
    _base_type,
    _engine_types,
    flag_for,
)


def json_schema() -> dict[str, Any]:
    """JSON Schema of a deployment spec, for the panel form and the API docs."""
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    engine_props: dict[str, Any] = {}
    defaults = EngineOptions()
    for name, hint in _engine_types().items():
        base, nullable = _base_type(hint)
        kind: Any = [names[base], "null"] if nullable else names[base]
        engine_props[name] = {"type": kind, "default": getattr(defaults, name),
                              "x-flag": flag_for(name)}
    engine_props["speculative_algorithm"]["enum"] = list(SPECULATIVE_ALGORITHMS)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "recipe", "gpus"],
        "properties": {
            "name": {"type": "string", "pattern": DEPLOYMENT_NAME.pattern},
            "recipe": {"type": "string"},
            "gpus": {"type": "array", "items": {"type": "integer", "minimum": 0},
                     "uniqueItems": True, "minItems": 1},
            "engine": {"type": "object", "additionalProperties": False,
                       "properties": engine_props},
            "extra_args": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "secrets": {"type": "array", "items": {"type": "string"}},
        },
    }
