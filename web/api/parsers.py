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

from appliance.nesting import brackets_over, depth_over

# A spec is three levels deep inside {"spec": ...}; anything past this is not a spec.
MAX_JSON_DEPTH = 16
DEPTH_FIX = "a deployment spec is 4 levels deep; send the spec itself"


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


class SpecYAMLError(yaml.MarkedYAMLError):
    """A YAML document the spec loader refuses: too deep, with an alias, or holding what JSON
    cannot; where it is, when known."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class _SpecLoader(yaml.SafeLoader):
    """safe_load without timestamps (`name: 2026-01-12` stays the string it reads as: a date
    object could not be stored as JSON), without aliases (a spec has no use for them, and
    nested ones expand exponentially), and bounded in depth as it composes: PyYAML's
    composer recurses once per level (a RecursionError near 900), and its scanner's time
    grows with the square of the open flow levels (50,000 `[` took 150 s); refused at the
    first node past MAX_JSON_DEPTH, it has read no more than that many levels."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise SpecYAMLError("aliases (*name) are not accepted; write the value out", mark)
        if not self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            return super().compose_node(parent, index)  # a scalar: no level of its own
        self._depth += 1
        try:
            if self._depth > MAX_JSON_DEPTH:
                raise SpecYAMLError(f"nested deeper than {MAX_JSON_DEPTH} levels ({DEPTH_FIX})",
                                    mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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


def spec_yaml_load(text: str) -> Any:
    """A spec (or part of one) written in YAML, as JSON can hold it: raises yaml.YAMLError
    saying where it is malformed, that it nests too deep or holds an alias, or what in it
    JSON has no type for."""
    if brackets_over(text, 4 * MAX_JSON_DEPTH):  # before the scanner's square-time lookahead
        raise SpecYAMLError(f"nested deeper than {MAX_JSON_DEPTH} levels ({DEPTH_FIX}): over "
                            f"{4 * MAX_JSON_DEPTH} [ or {{ open at once")
    data = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 (a SafeLoader)
    problem = _not_json(data)
    if problem:
        raise SpecYAMLError(problem)
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
