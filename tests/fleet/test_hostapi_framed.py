"""The ingest's framed batches (an event a line, as appliance/runtime/panel_link.py
events_body sends them): each payload's text is stored and published as it came, which must
be byte for byte what reading the body whole and encoding each payload again gives; a body
framed but not plainly valid is read whole, as before."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from appliance.runtime.panel_link import event_json, events_body
from tests.rows import ready
from web.deployments.live import stream_key
from web.deployments.models import Event
from web.fleet import services

from .hosts import joined

pytestmark = pytest.mark.django_db

# Texts that an encoding must escape: quotes, a backslash, a tab, a CR, non-ASCII, a
# control character, and the decode line's payload of numbers, booleans and a null.
EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("log", {"stream": "stdout", "text": 'a "quoted" \\ path\twith a tab'}),
    ("log", {"stream": "stderr", "text": "progress 10%\r50%\r naïve café ✓ \x1b[0m"}),
    ("metric", {"kind": "decode_stats", "line": 3, "tp": 0, "running_req": 1,
                "accept_len": 3.2, "accept_rate": 0.4, "cuda_graph": True,
                "gen_throughput": 165.82, "queue_req": 0, "spec": None}),
    ("progress", {"kind": "weights_progress", "done": 1, "total": 64, "unit": "shards"}),
]
ROW = {"log_cursor": "1767225600123456789:4"}


def _framed(events: list[tuple[str, dict[str, Any]]] = EVENTS, **fields: Any) -> bytes:
    return events_body([event_json(kind, payload) for kind, payload in events],
                       row=ROW, **fields)


def _ingest(pk: int, credential: str, body: bytes) -> tuple[int, dict[str, Any]]:
    answer = Client().post(f"/api/fleet/host/deployments/{pk}/events/", body,
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {credential}")
    return answer.status_code, answer.json()


def _published(live_channel: Any, pk: int, count: int) -> list[dict[str, Any]]:
    """The live entries' data, without seq and time, as raw text decoded once."""
    deadline = time.monotonic() + 10
    while len(entries := live_channel.xrange(stream_key(pk))) < count:
        assert time.monotonic() < deadline, entries
        time.sleep(0.05)
    out = []
    for _, fields in entries:
        text = fields[b"data"].decode()
        assert "\n" not in text and "\r" not in text  # one SSE line each
        out.append({"kind": json.loads(text)["kind"],
                    "payload_text": text.split(',"payload":', 1)[1][:-1]})
    return out


def test_a_framed_body_is_read_as_the_whole_body_is() -> None:
    body = _framed(start_token="t1", after="1767225600000000000:1")
    framed = services.event_batch_framed(body)
    whole = services.event_batch_from(json.loads(body))
    assert framed is not None and whole.encoded is None
    assert (framed.events, framed.row, framed.start_token, framed.after) == (
        whole.events, whole.row, whole.start_token, whole.after)
    assert framed.encoded == [event_json("", p)[len('["",'):-1] for _, p in EVENTS]
    # No fields but the events: still framed.
    bare = events_body([event_json(kind, payload) for kind, payload in EVENTS])
    assert services.event_batch_framed(bare) is not None


@pytest.mark.django_db(transaction=True)
def test_a_framed_batch_is_stored_and_published_as_one_read_whole(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    framed_row, whole_row = ready(name="framed", gpus=[0]), ready(name="whole", gpus=[1])
    for row in (framed_row, whole_row):
        services.placement_assign(deployment=row, host_name="gpu-2")
    body = _framed()
    assert _ingest(framed_row.pk, done.credential, body)[0] == 200
    # The same batch as a hand-made client sends it: one line, spaces, read whole.
    plain = json.dumps({"events": [list(e) for e in EVENTS], "row": ROW}).encode()
    assert services.event_batch_framed(plain) is None
    assert _ingest(whole_row.pk, done.credential, plain)[0] == 200

    def stored(pk: int) -> list[tuple[str, dict[str, Any]]]:
        return [(e.kind, e.payload) for e in Event.objects.filter(
            deployment_id=pk, kind__in=["log", "metric", "progress"]).order_by("seq")]

    assert stored(framed_row.pk) == stored(whole_row.pk) == EVENTS
    assert (_published(live_channel, framed_row.pk, len(EVENTS))[-len(EVENTS):]
            == _published(live_channel, whole_row.pk, len(EVENTS))[-len(EVENTS):])


def _lines(body: bytes) -> list[str]:
    return body.decode().split("\n")


def _with_line(body: bytes, i: int, line: str) -> bytes:
    lines = _lines(body)
    lines[i] = line
    return "\n".join(lines).encode()


@pytest.mark.parametrize("variant", [
    "cr_as_whitespace", "tab_as_whitespace", "non_ascii", "nan", "unknown_kind",
    "no_comma", "trailing_comma", "not_an_object", "text_too_long", "events_again",
    "one_line", "two_events_a_line"])
def test_a_body_framed_but_not_plainly_valid_is_read_whole(variant: str) -> None:
    body = _framed()
    first = _lines(body)[1]  # the first event's line: `["log",{...}],`
    made = {
        "cr_as_whitespace": _with_line(body, 1, first.replace('{"stream"', '{\r"stream"')),
        "tab_as_whitespace": _with_line(body, 1, first.replace('{"stream"', '{\t"stream"')),
        "non_ascii": _with_line(body, 1, first.replace("path", "pâth")),
        "nan": _with_line(body, 1, '["metric",{"value":NaN}],'),
        "unknown_kind": _with_line(body, 1, first.replace('["log"', '["status"')),
        "no_comma": _with_line(body, 1, first[:-1]),
        "trailing_comma": _with_line(body, len(_lines(body)) - 2,
                                     _lines(body)[-2] + ","),
        "not_an_object": _with_line(body, 1, '["log",["stdout","x"]],'),
        "text_too_long": _with_line(body, 1, event_json(
            "log", {"stream": "stdout", "text": "x" * (services.MAX_TEXT + 1)}) + ","),
        "events_again": _with_line(body, len(_lines(body)) - 1,
                                   _lines(body)[-1][:-1] + ',"events":[]}'),
        "one_line": body.replace(b"\n", b""),
        "two_events_a_line": _with_line(body, 1, first + _lines(body)[2]),
    }[variant]
    assert services.event_batch_framed(made) is None
    # What the whole-body reading makes of it stands: stored re-encoded, or refused.
    try:
        whole = json.loads(made)
    except ValueError:
        return
    if variant in ("cr_as_whitespace", "tab_as_whitespace", "non_ascii", "one_line",
                   "two_events_a_line", "nan"):
        # Valid JSON, read whole and encoded again (NaN is then the database's 400:
        # host_events_append's DataError).
        assert services.event_batch_from(whole).encoded is None
    else:
        with pytest.raises(services.FleetError):
            services.event_batch_from(whole)
