"""The log pane's reads of a deployment's events: its tail, pages of its history (by kind
and text), and the whole-log download.

The detail page never replays the record: it opens at the tail and pages on demand, each
page one keyset query on (deployment, seq) (the event_seq_unique index; rare kinds have
the partial index event_notable). A text search over the dense kinds reads at most
SEARCH_WINDOW seqs per request and says where it stopped, so no request scans a whole
long log; the browser asks again from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce

from .models import LINE_KINDS, NOTABLE_KINDS, Deployment, Event

TAIL_LINES = 500  # what the detail page opens with
SEARCH_WINDOW = 20_000  # seqs one text-search request reads at most
_DENSE_KINDS = frozenset(LINE_KINDS) - NOTABLE_KINDS  # log: most rows of a busy deployment


@dataclass(frozen=True)
class EventPage:
    events: list[dict[str, Any]]  # wire events, oldest first
    next_before: int | None  # the `before` of the page older than this one; None at the start
    next_after: int | None  # the `after` of the next newer page; None when asked backwards


def _line_text() -> Coalesce:
    """What a search matches: a line's text, or a marker's summary, message or status."""
    return Coalesce(KeyTextTransform("text", "payload"), KeyTextTransform("summary", "payload"),
                    KeyTextTransform("message", "payload"), KeyTextTransform("status", "payload"))


def _lines(deployment_id: int, kinds: frozenset[str], text: str) -> QuerySet[Event]:
    rows = Event.objects.filter(deployment_id=deployment_id, kind__in=sorted(kinds))
    if text:
        rows = rows.alias(line_text=_line_text()).filter(line_text__icontains=text)
    return rows


def event_tail(*, deployment_id: int, last_seq: int, limit: int = TAIL_LINES) -> list[Event]:
    """The last `limit` lines of the log up to last_seq, oldest first."""
    rows = _lines(deployment_id, frozenset(LINE_KINDS), "").filter(seq__lte=last_seq)
    return list(reversed(rows.order_by("-seq")[:limit]))


def event_history(*, deployment_id: int, limit: int, kinds: frozenset[str] = frozenset(),
                  text: str = "", before: int | None = None,
                  after: int | None = None) -> EventPage:
    """A page of lines before `before` (newest first from the end when neither is given) or
    after `after`, of `kinds` (all line kinds when empty) whose text contains `text`."""
    kinds = kinds or frozenset(LINE_KINDS)
    rows = _lines(deployment_id, kinds, text)
    if after is not None:
        page = list(rows.filter(seq__gt=after).order_by("seq")[:limit])
        return EventPage([e.to_wire() for e in page], None,
                         page[-1].seq if len(page) == limit else None)
    floor = 0
    if text and kinds & _DENSE_KINDS:
        top = before if before is not None else _last_seq(deployment_id) + 1
        floor = max(0, top - SEARCH_WINDOW)
        rows = rows.filter(seq__gte=floor)
    if before is not None:
        rows = rows.filter(seq__lt=before)
    page = list(rows.order_by("-seq")[:limit])
    page.reverse()
    if len(page) == limit:
        next_before: int | None = page[0].seq
    else:
        next_before = floor if floor > 1 else None
    return EventPage([e.to_wire() for e in page], next_before, None)


def _last_seq(deployment_id: int) -> int:
    return Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id)


def event_last_seq(*, deployment_id: int) -> int:
    """The seq of the deployment's newest event (0 before any; every seq up to it is
    committed): where a live feed starts."""
    return _last_seq(deployment_id)


def event_log_page(*, deployment_id: int, after: int, limit: int) -> list[Event]:
    """The next `limit` lines after seq `after`, for the whole-log download."""
    rows = Event.objects.filter(deployment_id=deployment_id, seq__gt=after,
                                kind__in=sorted(LINE_KINDS))
    return list(rows.order_by("seq")[:limit])


def event_log_line(event: Event) -> str:
    """One line of the downloaded log: UTC time, seq, and the line as the page shows it."""
    p = event.payload or {}
    if event.kind == "log":
        body = str(p.get("text", ""))
        if p.get("stream") == "stderr":
            body = "[stderr] " + body
    elif event.kind == "build":
        body = "[build] " + str(p.get("text") or p.get("kind") or "")
    elif event.kind == "diagnosis":
        body = f"[diagnosis] {p.get('cause', '')}: {p.get('summary', '')} Fix: {p.get('fix', '')}"
    elif event.kind == "alert":
        body = f"[alert] {p.get('id', '')} {p.get('state', '')}: {p.get('summary', '')}"
    else:  # phase, status
        body = f"[{event.kind}] " + " ".join(
            str(p[k]) for k in ("status", "message") if p.get(k))
    return f"{event.ts.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z #{event.seq} {body}\n"
