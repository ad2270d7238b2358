"""Compact JSON for the log path: the agent's batches, the panel's reading of them, the
stored payloads and the live entries.

With orjson the agent's shipper took 7.0 to 8.3 µs of CPU a decode line against 10.0 to 12.0,
and the panel 0.22 to 0.26 of a core against 0.26 to 0.29, at 10,000 lines a second
(`bench/log_path.py`; docs/performance.md, Log path). Its text is compact
UTF-8 (no `\\u` escapes but for control characters, which JSON requires escaped: a newline
or tab never appears raw in it).

What orjson refuses to write (a dict key that is not a string, an integer beyond 64 bits,
a lone surrogate in a string, a type it does not know) is written by the standard library,
compact and ASCII (a lone surrogate has no UTF-8, only its escape). What it refuses to read
(NaN and Infinity, which the standard library writes and reads) is read by the standard
library, so no body that was read before is refused now; such a number is written back as
it came (NonFinite), never as orjson's null, so a store that refuses it (PostgreSQL's
jsonb) still refuses it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["NonFinite", "dumps", "dumps_text", "loads"]

_stdlib_encode = json.JSONEncoder(separators=(",", ":")).encode


class NonFinite(float):
    """A NaN or Infinity read from JSON text: orjson refuses to write a float subclass, so
    it is written by the standard library, as `NaN` or `Infinity` again."""


def dumps(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: see the module's docstring
        return _stdlib_encode(value).encode()


def dumps_text(value: Any) -> str:
    """dumps(), as text."""
    return dumps(value).decode()


def loads(data: bytes | str) -> Any:
    """JSON text -> value; ValueError (or RecursionError) for text that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # NaN, Infinity; or the standard library's own error.
        return json.loads(data, parse_constant=NonFinite)
