"""Deployment specs written in YAML, read as JSON can hold them: bounded in depth as they
compose, without aliases or timestamps, refused where they hold what JSON has no type for.
The panel's form and the API's YAML body both read a spec through spec_yaml_load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from appliance.nesting import brackets_over

# A spec is three levels deep inside {"spec": ...}; anything past this is not a spec.
MAX_JSON_DEPTH = 16
DEPTH_FIX = "a deployment spec is 4 levels deep; send the spec itself"


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
