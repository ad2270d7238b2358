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


def flag_list_for_commit(ref: str) -> str | None:
    """The shipped flag list of a git commit: the file whose stem ends with its first 9 hex
    digits (sglang-ddtree-433c58ed7-flags.txt), whatever the recipe is called."""
    short = ref[:9]
    files = DATA_DIR.glob(f"*-{short}-flags.txt")
    matches = sorted(p.name.removesuffix("-flags.txt") for p in files)
    return matches[0] if matches else None


def flags_in_argv(argv: list[str]) -> list[tuple[int, str]]:
    """(index, flag) of every --flag in an argv list, with any =value stripped."""
    return [(i, item.split("=", 1)[0]) for i, item in enumerate(argv)
            if item.startswith("--") and len(item) > 2]


# difflib's ratio over the whole name: below 0.8 it pairs flags that merely share words.
SUGGEST_CUTOFF = 0.8
# The words the two names do not share must still look alike: a long common prefix such as
# "speculative-" would otherwise carry an unrelated flag over the cutoff.
DIFFERENCE_CUTOFF = 0.6


def _bare(flag: str) -> str:
    """A flag's name as compared: no leading dashes, underscores as dashes (snake_case typed
    from the spec's field names is the same flag)."""
    return flag.lstrip("-").replace("_", "-")


def _differing_words(a: str, b: str) -> tuple[str, str]:
    """What is left of two dashed names once their shared leading and trailing words go."""
    wa, wb = a.split("-"), b.split("-")
    while wa and wb and wa[0] == wb[0]:
        wa, wb = wa[1:], wb[1:]
    while wa and wb and wa[-1] == wb[-1]:
        wa, wb = wa[:-1], wb[:-1]
    return "-".join(wa), "-".join(wb)


def _looks_alike(name: str, candidate: str) -> bool:
    left, right = _differing_words(name, candidate)
    if not left or not right:
        return True  # a word dropped or added; the whole-name ratio already bounds its length
    matcher = difflib.SequenceMatcher(None, left, right)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    # One wrong letter is a typo even in a short word ("max-bz"), where the ratio is low.
    return max(len(left), len(right)) - matched <= 1 or matcher.ratio() >= DIFFERENCE_CUTOFF


def _completion(name: str, starting: list[str]) -> str | None:
    """The flag a truncated name stands for, of those it begins, or None.

    Finishing its last word ("...-token" -> "...-tokens") beats adding one word
    ("--cuda-graph-max-bs" -> "--cuda-graph-max-bs-decode"); the shorter flag wins a tie.
    More than one word short, or under half the flag, is a stub, not a misspelling:
    "--tp" is no "--tp-size", "--torch-compile" no "--torch-compile-max-bs".
    """
    candidates = []
    for flag in starting:
        rest = flag[len(name):]
        words_added = rest.strip("-").count("-") + (1 if rest.startswith("-") else 0)
        if words_added <= 1 and 2 * len(name) >= len(flag):
            candidates.append((words_added, len(flag), flag))
    return min(candidates)[2] if candidates else None


def closest_flag(flag: str, known: frozenset[str]) -> str | None:
    """The known flag a misspelt one surely meant, or None when no flag is close enough."""
    name = _bare(flag)
    if not name:
        return None
    by_name = {_bare(k): k for k in sorted(known)}
    if name in by_name:
        return by_name[name]  # the right flag written with underscores
    starting = [n for n in by_name if n.startswith(name)]
    if starting:
        completed = _completion(name, starting)
        return by_name[completed] if completed else None
    for close in difflib.get_close_matches(name, list(by_name), n=3, cutoff=SUGGEST_CUTOFF):
        if _looks_alike(name, close):
            return by_name[close]
    return None
