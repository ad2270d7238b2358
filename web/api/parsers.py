"""Request bodies: JSON with a bounded nesting (a deep body is a 400 that says so, not a
RecursionError somewhere after the parse), YAML for deployment specs, and the shapes a
spec body may take (bare, or wrapped in {"spec": ...})."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from django.conf import settings
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser

# A spec is three levels deep inside {"spec": ...}; anything past this is not a spec.
MAX_JSON_DEPTH = 16


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether value nests deeper than limit (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, Mapping) else \
            item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, Mapping | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
            deep = True
        else:
            deep = json_depth_exceeds(data, MAX_JSON_DEPTH)
        if deep:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.")
        return data


class _SpecLoader(yaml.SafeLoader):
    """safe_load without timestamps: `name: 2026-01-12` stays the string it reads as (a
    date object could not be stored as JSON)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

_JSON_SCALARS = (str, int, float, bool, type(None))


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _not_json(value: Any) -> str | None:
    """What in value JSON cannot hold (a set, bytes, a non-string key), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            bad = next((k for k in item if not isinstance(k, str)), None)
            if bad is not None:
                return f"a key that is not a string ({bad!r}); quote it"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif not isinstance(item, _JSON_SCALARS):
            return f"a {type(item).__name__} value, which JSON has no type for"
    return None


class YAMLParser(BaseParser):
    """`Content-Type: application/yaml`: a spec file's text as it is (or the JSON body's
    shape written in YAML). Aliases are refused: a spec has no use for them, and nested
    ones expand exponentially."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 1024 * 1024)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError("YAML parse error - the body is over the limit "
                             "(APPLIANCE_MAX_BODY_BYTES).")
        try:
            text = raw.decode("utf-8")
            if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=_SpecLoader)):
                raise ParseError("YAML parse error - aliases (*name) are not accepted; "
                                 "write the value out.")
            data = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 (a SafeLoader)
        except UnicodeDecodeError as exc:
            raise ParseError("YAML parse error - the body is not UTF-8.") from exc
        except yaml.YAMLError as exc:
            raise ParseError(f"YAML parse error - {_yaml_where(exc)}") from exc
        problem = _not_json(data)
        if problem is None and json_depth_exceeds(data, MAX_JSON_DEPTH):
            problem = f"nested deeper than {MAX_JSON_DEPTH} levels"
        if problem:
            raise ParseError(f"YAML parse error - {problem}.")
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
