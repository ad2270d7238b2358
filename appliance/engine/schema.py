"""JSON Schema of a deployment spec, from EngineOptions' fields (for forms and API docs)."""

from __future__ import annotations

from typing import Any

from appliance.engine import bounds, restart
from appliance.engine.spec import (
    DEPLOYMENT_NAME,
    MAX_REPLICAS,
    SPECULATIVE_ALGORITHMS,
    EngineOptions,
    _base_type,
    _engine_types,
    flag_for,
)

# JSON Schema's own pattern dialect (ECMA 262): no newline or other control character.
_NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
_LABEL = f"^{DEPLOYMENT_NAME.pattern}$"


def _engine_property(name: str, hint: Any, default: Any) -> dict[str, Any]:
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    base, nullable = _base_type(hint)
    prop: dict[str, Any] = {"type": [names[base], "null"] if nullable else names[base],
                            "default": default, "x-flag": flag_for(name)}
    if base is str:
        prop["maxLength"] = bounds.MAX_PATH if name in bounds.PATH_FIELDS else bounds.MAX_TEXT
        prop["pattern"] = _NO_CONTROL
    elif base is int:
        prop["minimum"], prop["maximum"] = bounds.INT_RANGES.get(
            name, (-bounds.INT32_MAX, bounds.INT32_MAX))
    elif base is float:
        low, high = bounds.FLOAT_RANGES.get(name, (-bounds.FLOAT_ABS_MAX, bounds.FLOAT_ABS_MAX))
        prop["exclusiveMinimum"], prop["exclusiveMaximum"] = low, high
    return prop


def _strings(max_items: int, max_length: int) -> dict[str, Any]:
    return {"type": "array", "maxItems": max_items,
            "items": {"type": "string", "maxLength": max_length, "pattern": _NO_CONTROL}}


def json_schema() -> dict[str, Any]:
    """JSON Schema of a deployment spec, for the panel form and the API docs."""
    defaults = EngineOptions()
    engine_props = {name: _engine_property(name, hint, getattr(defaults, name))
                    for name, hint in _engine_types().items()}
    engine_props["speculative_algorithm"]["enum"] = list(SPECULATIVE_ALGORITHMS)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "recipe", "gpus"],
        "properties": {
            "name": {"type": "string", "pattern": f"^{DEPLOYMENT_NAME.pattern}$"},
            "recipe": {"type": "string", "maxLength": bounds.MAX_RECIPE, "pattern": _NO_CONTROL},
            "gpus": {"type": "array", "uniqueItems": True, "minItems": 1,
                     "maxItems": bounds.MAX_GPUS,
                     "items": {"type": "integer", "minimum": 0, "maximum": bounds.MAX_GPU_ID}},
            "engine": {"type": "object", "additionalProperties": False,
                       "properties": engine_props},
            "extra_args": _strings(bounds.MAX_EXTRA_ARGS, bounds.MAX_ARG),
            "env": {"type": "object", "maxProperties": bounds.MAX_ENV,
                    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                                      "maxLength": bounds.MAX_ENV_NAME},
                    "additionalProperties": {"type": "string", "maxLength": bounds.MAX_ENV_VALUE,
                                             "pattern": _NO_CONTROL}},
            "secrets": _strings(bounds.MAX_SECRETS, bounds.MAX_ENV_NAME),
            "self_check": {"type": "boolean", "default": True},
            "restart": {"type": "object", "additionalProperties": False, "properties": {
                "policy": {"type": "string", "enum": list(restart.POLICIES), "default": "never"},
                "max_restarts": {"type": "integer", "minimum": 0,
                                 "maximum": restart.MAX_RESTARTS_LIMIT, "default": 5}}},
            "replicas": {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS, "default": 1},
            "host": {"type": ["string", "null"], "pattern": _LABEL},
            "companion": {"type": ["string", "null"], "pattern": _LABEL},
        },
    }
