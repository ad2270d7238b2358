"""SGLang flag lists per source, generated from SGLang's own parser by bench/gen_sglang_flags.py."""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"


@functools.cache
def load_flags(name: str) -> frozenset[str] | None:
    """Flags of one source (file appliance/data/<name>-flags.txt), or None when not shipped."""
    path = DATA_DIR / f"{name}-flags.txt"
    if not path.is_file():
        return None
    lines = (line.strip() for line in path.read_text().splitlines())
    return frozenset(line for line in lines if line.startswith("--"))


def available_flag_lists() -> list[str]:
    return sorted(p.name.removesuffix("-flags.txt") for p in DATA_DIR.glob("*-flags.txt"))


def flags_in_argv(argv: list[str]) -> list[tuple[int, str]]:
    """(index, flag) of every --flag in an argv list, with any =value stripped."""
    return [(i, item.split("=", 1)[0]) for i, item in enumerate(argv)
            if item.startswith("--") and len(item) > 2]


def closest_flag(flag: str, known: frozenset[str]) -> str | None:
    close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None
