"""OpenAPI for the endpoints that take a deployment spec: JSON or YAML, a bare spec or the
{"spec": ...} wrapper (web/api/parsers.py). The spec's own schema comes from
appliance.engine.schema (JSON Schema), rewritten into the OpenAPI 3.0 dialect."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter

from appliance.engine.schema import json_schema
from web.deployments.serializers import DeploymentSerializer

SPEC_YAML = """\
name: kimi-ddtree
recipe: kimi-k2.6-ddtree
gpus: [0, 1, 2, 3, 4, 5, 6, 7]
engine:
  model_path: /models/Kimi-K2.6
  tp_size: 8
  speculative_algorithm: DDTREE
  speculative_draft_model_path: /models/Kimi-K2.6-DFlash
  speculative_num_draft_tokens: 8
  speculative_ddtree_budget: 32
"""


def _as_openapi_30(node: Any) -> Any:
    """JSON Schema 2020 -> OpenAPI 3.0: `type: [x, "null"]` is `nullable`, an exclusive
    bound is a flag on the bound, and `propertyNames` does not exist."""
    if isinstance(node, list):
        return [_as_openapi_30(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_openapi_30(v) for k, v in node.items() if k != "propertyNames"}
    if isinstance(out.get("type"), list):
        kinds = [t for t in out["type"] if t != "null"]
        out["type"], out["nullable"] = kinds[0], len(kinds) < len(node["type"])
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[flag], out[bound] = out[bound], True
    if out.get("default") is None and "default" in out and not out.get("nullable"):
        del out["default"]
    return out


def spec_schema() -> dict[str, Any]:
    return {**_as_openapi_30(json_schema()),
            "description": "A deployment spec, as in examples/*.yaml."}


def spec_request(*, flags: bool) -> dict[str, Any]:
    """The request body, for JSON and YAML alike: the wrapper (with the create flags where
    the endpoint has them) or the spec itself."""
    extra = {name: {"type": "boolean", "default": False}
             for name in ("confirm_warnings", "rebuild_image")} if flags else {}
    wrapper = {"type": "object", "required": ["spec"],
               "properties": {"spec": spec_schema(), **extra}}
    body = {"oneOf": [wrapper, spec_schema()]}
    return {"application/json": body, "application/yaml": body}


_FLAG_PARAMS = [
    OpenApiParameter(name, OpenApiTypes.BOOL, OpenApiParameter.QUERY, required=False,
                     description=f"{text} For a bare spec, which has no room for it; a "
                                 "wrapped body's own field wins.")
    for name, text in (("confirm_warnings", "Deploy despite pre-flight warnings."),
                       ("rebuild_image", "Build the engine image without the cache."))]

CREATE_SCHEMA: dict[str, Any] = {
    "request": spec_request(flags=True),
    "responses": {201: DeploymentSerializer},
    "parameters": _FLAG_PARAMS,
    "description": (
        "Create a deployment. The body is a spec or `{\"spec\": ..., \"confirm_warnings\": "
        "..., \"rebuild_image\": ...}`, as JSON (`Content-Type: application/json`) or YAML "
        "(`Content-Type: application/yaml`, e.g. `curl --data-binary @examples/"
        "kimi-ddtree.yaml`). A spec with pre-flight warnings needs `confirm_warnings`; a "
        "bad body is a 400 naming the field (YAML: the line and column)."),
    "examples": [
        OpenApiExample("A spec file as it is", value=SPEC_YAML, media_type="application/yaml",
                       request_only=True),
        OpenApiExample("Wrapped, with a confirmation", request_only=True,
                       media_type="application/json",
                       value={"spec": {"name": "kimi-ddtree", "recipe": "kimi-k2.6-ddtree",
                                       "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
                                       "engine": {"model_path": "/models/Kimi-K2.6",
                                                  "tp_size": 8}},
                              "confirm_warnings": True}),
    ],
}
