"""SSE frames of a deployment's stream: events (with their seq as the id) and metric points.

A frame is framed once, by the live feed, and its bytes go to every stream. A metric
point has no id: it is live only (the series table is its record), so a browser's
Last-Event-ID stays the last event's seq. A behind frame tells a stream that fell behind
the feed's ring that it is catching up from the record; a skip frame (no event of the
record) tells a stream that fell too far behind (SKIP_LAG) which seqs it skipped.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from . import live

POINT = -1  # the seq of a metric point's frame


class Frame(NamedTuple):
    seq: int  # POINT for a metric point: live only, no id, never replayed
    data: bytes  # the whole SSE frame, encoded
    end: bool


def sse_frame(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\ndata: {live.wire_json(event)}\n\n"


def event_frame(event: dict[str, Any]) -> Frame:
    return Frame(event["seq"], sse_frame(event).encode(), event.get("kind") == "end")


def entry_frame(seq: int, fields: list[bytes]) -> Frame:
    """A live entry as a frame, from its fields as Redis answers them (name, value, name,
    value: the publisher writes `data` then `kind`); entries from before `kind` was
    published are decoded."""
    kind: bytes | None
    if len(fields) == 4 and fields[0] == b"data" and fields[2] == b"kind":
        data, kind = fields[1], fields[3]
    else:
        named = entry_fields(fields)
        data, kind = named[b"data"], named.get(b"kind")
    if kind is None:
        return event_frame(json.loads(data))
    return Frame(seq, b"id: %d\ndata: %s\n\n" % (seq, data), kind == b"end")


def entry_fields(fields: list[bytes]) -> dict[bytes, bytes]:
    """An entry's fields (name, value, name, value) by name."""
    return dict(zip(fields[::2], fields[1::2], strict=True))


def skip_frame(first: int, last: int) -> Frame:
    """Told to a stream too far behind: it will not get seqs first..last live (the log pane
    says so and offers the history). Its id is `last`, so a browser that reconnects resumes
    after them instead of asking for them again."""
    body = {"seq": last, "kind": "skip",
            "payload": {"from": first, "to": last, "skipped": last - first + 1}}
    return Frame(last, sse_frame(body).encode(), False)


def behind_frame(last: int, head: int) -> Frame:
    """Told to a stream that fell behind what the feed keeps (a slow client, a tab that
    stopped reading): the seqs after `last` up to `head` come from the record, in order,
    before it is live again (the page says it is catching up). It has no id (no event of
    the record); its seq is the stream's last, so a page that has it ignores it as a line."""
    body = {"seq": last, "kind": "behind", "payload": {"from": last + 1, "head": head,
                                                       "behind": head - last}}
    return Frame(last, b"data: %s\n\n" % live.wire_json(body).encode(), False)


def point_frame(fields: list[bytes]) -> Frame:
    return Frame(POINT, b"data: %s\n\n" % entry_fields(fields)[b"data"], False)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
