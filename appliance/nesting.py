"""JSON from outside, bounded in nesting: a body of 5,000 `[` (10 kB) is a refusal that names
the limit, never a RecursionError out of the parser or out of code that walks what it parsed.

Python's json parser (C) recurses once per level and stops cleanly with a RecursionError near
the interpreter's recursion limit, in time linear in the text; what it did parse is then
measured by a walk that recurses nowhere. (A scan of the raw text before the parse was the
other way: finding the strings in it cost 4 ms a megabyte, twice the parse itself, on the
gateway's path for a long conversation; the walk costs per container, microseconds for a
chat request.)
"""

from __future__ import annotations

import json
from typing import Any

_CONTAINERS = (dict, list)  # what json.loads and YAML's safe loader make


class TooDeep(ValueError):
    """A document nested deeper than `limit` levels."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels")
        self.limit = limit


def depth_over(value: Any, limit: int) -> bool:
    """Whether value nests containers deeper than limit (`[]` is one level, `{"a": [1]}`
    two): a level at a time, iterative, stopping at the first level past the limit."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, _CONTAINERS)]
    return False


def json_loads_bounded(raw: str | bytes, *, limit: int) -> Any:
    """json.loads, raising TooDeep past `limit` levels (and ValueError for what is not JSON,
    as json.loads does)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise TooDeep(limit) from None
    if depth_over(data, limit):
        raise TooDeep(limit)
    return data


_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_OPENERS = frozenset(b"[{")


def brackets_over(raw: str | bytes, limit: int) -> bool:
    """Whether more than `limit` `[` or `{` are open at once anywhere in raw, quoted or not:
    linear and before any parse. For YAML, whose scanner's time grows with the square of
    the open flow levels, at a limit well past what a real document's strings and comments
    could hold unclosed."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for byte in data.translate(None, _NOT_BRACKETS):
        depth = depth + 1 if byte in _OPENERS else max(0, depth - 1)
        if depth > limit:
            return True
    return False
