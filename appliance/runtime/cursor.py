"""Where a follower is in an engine's output: the last shipped line's Docker timestamp and
how many lines came at that instant (Cursor), stored with each batch; a follower that
resumes re-reads a little before it and drops what it covers (CursorFilter)."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.runtime.containers import LogLine

RESUME_OVERLAP_S = 1.0  # re-read this much before the cursor; the cursor drops repeats


@dataclass(frozen=True)
class Cursor:
    """The last shipped line: its Docker timestamp and how many lines at that instant."""

    ts_ns: int = 0
    count: int = 0

    def encode(self) -> str:
        return f"{self.ts_ns}:{self.count}" if self.ts_ns else ""

    @classmethod
    def decode(cls, text: str) -> Cursor:
        # A fleet host's batches that move no line mark the cursor ("<cursor>#<n>"):
        # the line position is the part before the mark.
        stamp, _, count = (text or "").partition("#")[0].partition(":")
        if not stamp.isdigit():
            return cls()
        return cls(int(stamp), int(count or 0))

    def since(self) -> float | None:
        return self.ts_ns / 1e9 - RESUME_OVERLAP_S if self.ts_ns else None

    def advance(self, ts_ns: int) -> Cursor:
        return Cursor(ts_ns, self.count + 1 if ts_ns == self.ts_ns else 1)

    def advance_all(self, lines: list[LogLine]) -> Cursor:
        """advance() for each line in turn, with one Cursor made at the end."""
        ts_ns, count = self.ts_ns, self.count
        for line in lines:
            ts = line.ts_ns or 0
            if ts == ts_ns:
                count += 1
            else:
                ts_ns, count = ts, 1
        return Cursor(ts_ns, count)


class CursorFilter:
    """Drops lines at or before a cursor (the overlap of a resumed read)."""

    def __init__(self, cursor: Cursor) -> None:
        self.cursor = cursor
        self._seen_at_cursor = 0

    def new(self, line: LogLine) -> bool:
        ts = line.ts_ns or 0
        if ts < self.cursor.ts_ns:
            return False
        if ts == self.cursor.ts_ns and self._seen_at_cursor < self.cursor.count:
            self._seen_at_cursor += 1
            return False
        return True
