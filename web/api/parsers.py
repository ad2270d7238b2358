"""Request bodies: JSON with a bounded nesting (a deep body is a 400 that says so, not a
RecursionError somewhere after the parse), YAML for deployment specs (read as the panel's
form reads them, web/deployments/spec_yaml.py), and the shapes a spec body may take (bare,
or wrapped in {"spec": ...})."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from django.conf import settings
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser

from appliance.nesting import depth_over
from web.deployments.spec_yaml import DEPTH_FIX, MAX_JSON_DEPTH, spec_yaml_load


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, bounded: a body nested past MAX_JSON_DEPTH is a 400 that names the
    limit (web/limits.py has refused a body over the size limit before any of this)."""

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_too_deep("JSON")) from None
        if depth_over(data, MAX_JSON_DEPTH):
            raise ParseError(_too_deep("JSON"))
        return data


def _too_deep(kind: str) -> str:
    return f"{kind} parse error - nested deeper than {MAX_JSON_DEPTH} levels ({DEPTH_FIX})."


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


class YAMLParser(BaseParser):
    """`Content-Type: application/yaml`: a spec file's text as it is (or the JSON body's
    shape written in YAML), through spec_yaml_load."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 1024 * 1024)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError("YAML parse error - the body is over the limit "
                             "(APPLIANCE_MAX_BODY_BYTES).")
        try:
            data = spec_yaml_load(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ParseError("YAML parse error - the body is not UTF-8.") from exc
        except yaml.YAMLError as exc:
            raise ParseError(f"YAML parse error - {_yaml_where(exc)}.") from exc
        return data


# The deployment endpoints (create, pre-flight): JSON, YAML, and the panel's forms.
SPEC_PARSERS = [BoundedJSONParser, YAMLParser, FormParser, MultiPartParser]
FLAGS = ("confirm_warnings", "rebuild_image")


def spec_body(data: Any, query: Mapping[str, Any]) -> dict[str, Any]:
    """The {"spec": ..., flags} shape from a wrapped body or a bare spec. A bare spec has no
    room for the flags (a spec refuses unknown keys), so they also come from the query
    string: `POST /api/deployments/?confirm_warnings=true`; a wrapped body's own win."""
    if not isinstance(data, Mapping):
        raise ValidationError({"spec": ["The body must be a deployment spec (a mapping: "
                                        "name, recipe, gpus, engine) or {\"spec\": ...}."]})
    if not data:  # no body at all (DRF gives an empty mapping, whatever the type)
        raise ValidationError({"spec": ["The body is empty: send a deployment spec (JSON or "
                                        "YAML) or {\"spec\": ...}."]})
    flags = {k: query[k] for k in FLAGS if k in query}
    if "spec" in data:
        return {**flags, **data}
    return {**flags, "spec": dict(data)}
