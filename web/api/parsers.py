"""JSON bodies with a bounded nesting: a deep body is a 400 that says so, not a
RecursionError somewhere after the parse."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

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
