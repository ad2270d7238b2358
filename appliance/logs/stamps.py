"""Docker's time prefix on a log line (`docker logs -t`, the agent's own reads): one reader.

Docker writes each line as `<RFC 3339 time with up to 9 fraction digits> <line>`, e.g.
`2026-12-01T10:00:00.123456789Z [2026-12-01 10:00:00 TP0] Load weight begin. ...`. The
engine agent reads with timestamps (its cursor), an operator pastes `docker logs -t`, the
rig records that way; the command line and the agent split it off here, the same way.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Iterator

_STAMP_MAX = 40  # "2026-12-01T10:00:00.123456789+00:00" is 35 characters


def split_docker_stamp(text: str) -> tuple[str | None, str]:
    """(stamp, rest) for a line with Docker's time prefix; (None, text) for any other line.

    Only a real stamp is split: date `YYYY-MM-DD`, `T`, clock, then `Z` or an offset, and
    one space; an engine line that begins with digits stays whole."""
    if len(text) < 21 or text[4:5] != "-" or text[10:11] != "T" or not text[:4].isdigit():
        return None, text
    space = text.find(" ", 19, _STAMP_MAX)
    if space < 0:
        return None, text
    stamp = text[:space]
    if not _is_stamp(stamp):
        return None, text
    return stamp, text[space + 1:]


def without_docker_stamps(lines: Iterable[str]) -> Iterator[str]:
    """Lines as the engine printed them, whether read with `docker logs -t` or without."""
    for line in lines:
        yield split_docker_stamp(line)[1]


def parse_docker_ts(text: str) -> int:
    """Docker's RFC 3339 timestamp with up to 9 fraction digits -> Unix nanoseconds."""
    day, _, rest = text.partition("T")
    clock, offset = _clock_and_offset(rest)
    whole, _, frac = clock.partition(".")
    y, mo, d = (int(x) for x in day.split("-"))
    h, mi, s = (int(x) for x in whole.split(":"))
    seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - offset
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


def _clock_and_offset(rest: str) -> tuple[str, int]:
    """`10:00:00.5Z` -> ("10:00:00.5", 0); `12:00:00+02:00` -> ("12:00:00", 7200)."""
    if rest.endswith("Z"):
        return rest[:-1], 0
    for sign in ("+", "-"):
        at = rest.rfind(sign)
        if at >= 8:
            hours, _, minutes = rest[at + 1:].partition(":")
            seconds = int(hours) * 3600 + int(minutes or 0) * 60
            return rest[:at], seconds if sign == "+" else -seconds
    return rest, 0


def _is_stamp(stamp: str) -> bool:
    """The shape of a stamp, checked without converting it (the agent splits every line)."""
    if stamp[7:8] != "-" or stamp[13:14] != ":" or stamp[16:17] != ":":
        return False
    if not (stamp[5:7] + stamp[8:10] + stamp[11:13] + stamp[14:16] + stamp[17:19]).isdigit():
        return False
    tail = stamp[19:]
    if tail.endswith("Z"):
        tail = tail[:-1]
    elif tail[-6:-5] in ("+", "-") and tail[-3:-2] == ":":
        tail = tail[:-6]
    else:
        return False
    return not tail or (tail[:1] == "." and tail[1:].isdigit())
