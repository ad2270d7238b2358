"""extra_args as typed engine options: a flag that is an EngineOptions field is taken out of
extra_args and becomes that option, so every type and range check and every pre-flight rule
sees it exactly as if it had been written under engine:. Any other flag passes through
(the unknown-flag rule checks it against the source's flag list).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.errors import FieldError

_INT = re.compile(r"[+-]?\d{1,19}")
_MAX_FLOAT_TEXT = 64


@dataclass
class Absorbed:
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, int] = field(default_factory=dict)  # option -> its extra_args index
    rest: list[str] = field(default_factory=list)
    rest_at: list[int] = field(default_factory=list)  # each rest item's index in extra_args
    errors: list[FieldError] = field(default_factory=list)


def _convert(text: str, base: type, where: str, flag: str) -> tuple[Any, FieldError | None]:
    if base is int:
        if _INT.fullmatch(text):
            return int(text), None
        return None, FieldError(where, f"{flag} needs an integer, got {text[:40]!r}",
                                f"write {flag} followed by a whole number")
    if base is float:
        try:
            value = float(text) if len(text) <= _MAX_FLOAT_TEXT else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            return None, FieldError(where, f"{flag} needs a finite number, got {text[:40]!r}",
                                    f"write {flag} followed by a number such as 0.85")
        return value, None
    return text, None


def _value_of(argv: list[str], i: int, inline: str | None, base: type,
              ) -> tuple[Any, int, FieldError | None]:
    """(typed value, items used, error) of the option flag at argv[i]."""
    flag, where = argv[i].split("=", 1)[0], f"extra_args[{i}]"
    if base is bool:
        if inline is not None:
            return None, 1, FieldError(where, f"{flag} is a switch and takes no value",
                                       f"write {flag} alone to turn it on, or leave it out")
        return True, 1, None
    if inline is not None:
        value, err = _convert(inline, base, where, flag)
        return value, 1, err
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        return None, 1, FieldError(where, f"{flag} needs a value", f"write {flag} VALUE")
    value, err = _convert(argv[i + 1], base, where, flag)
    return value, 2, err


def absorb(argv: list[str], base_types: Mapping[str, type],
           explicit: Collection[str]) -> Absorbed:
    """Split extra_args into engine option values and the flags that stay extra.

    explicit: the options the spec sets under engine: (a recipe's defaults are not, and an
    extra_args flag overrides them as an engine: key would).
    """
    out = Absorbed()
    i = 0
    while i < len(argv):
        item = argv[i]
        flag, eq, inline = item.partition("=")
        name = flag[2:].replace("-", "_")
        if not item.startswith("--") or name not in base_types:
            out.rest.append(item)
            out.rest_at.append(i)
            i += 1
            continue
        value, used, err = _value_of(argv, i, inline if eq else None, base_types[name])
        where = f"extra_args[{i}]"
        if err is None and name in explicit:
            err = FieldError(where, f"{flag} in extra_args and engine.{name} both set it",
                             f"keep one: set engine.{name} and remove {flag} from extra_args")
        elif err is None and name in out.values:
            err = FieldError(where, f"{flag} appears twice in extra_args", "keep one")
        if err is not None:
            out.errors.append(err)
        else:
            out.values[name], out.origin[name] = value, i
        i += used
    return out


def original_field(where: str, rest_at: list[int]) -> str:
    """A field named on the stored extra_args ("extra_args[1]") as the one the person wrote
    ("extra_args[3]", when option flags were taken out before it)."""
    match = re.fullmatch(r"extra_args\[(\d+)\]", where)
    if match is None or int(match[1]) >= len(rest_at):
        return where
    return f"extra_args[{rest_at[int(match[1])]}]"


def relocate(errors: list[FieldError], origin: Mapping[str, int]) -> list[FieldError]:
    """An engine option's error points at the extra_args item it came from."""
    moved = []
    for err in errors:
        name = err.field.removeprefix("engine.")
        if err.field.startswith("engine.") and name in origin:
            flag = "--" + name.replace("_", "-")
            err = FieldError(f"extra_args[{origin[name]}]", f"{flag}: {err.message}", err.fix)
        moved.append(err)
    return moved
