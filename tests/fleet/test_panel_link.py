"""A host's link to the panel (appliance.runtime.panel_link) against a live panel: join
once, keep the credential 0600, report, ship events; refused the way the panel says."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
import requests

from appliance.runtime.container_plan import Identity
from appliance.runtime.cursor import Cursor
from appliance.runtime.host_sink import RemoteSink
from appliance.runtime.panel_link import PanelLink, PanelRefused, panel_link_open
from tests.rows import ready
from web.deployments.models import Event, StatusBody
from web.deployments.selectors import deployment_list
from web.fleet import services
from web.fleet.models import FleetHost, JoinToken

from .hosts import report

pytestmark = pytest.mark.django_db(transaction=True)


def _open(live_server, path: Path, token: str):  # type: ignore[no-untyped-def]
    return panel_link_open(panel_url=live_server.url, credential_path=path, token=token,
                           name="gpu-2", report=report())


def test_a_host_joins_once_and_keeps_its_credential_to_itself(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = services.jointoken_create(host_name="gpu-2").secret
    path = tmp_path / "host-credential"
    link = _open(live_server, path, token)
    assert path.read_text().strip() == link.credential
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = _open(live_server, path, token)  # a restarted agent: the stored credential
    assert again.credential == link.credential and JoinToken.objects.get().uses == 1
    assert again.me()["host"] == "gpu-2"


def test_a_host_ships_its_engines_events_and_is_refused_anothers(live_server, tmp_path,  # type: ignore[no-untyped-def]
                                                                 live_channel) -> None:
    link = _open(live_server, tmp_path / "c", services.jointoken_create(host_name="gpu-2").secret)
    mine, theirs = ready(), ready(name="second", gpus=[1])
    services.placement_assign(deployment=mine, host_name="gpu-2")
    last = link.ship(mine.pk, [("log", {"stream": "stdout", "text": "hello"})],
                     row={"log_cursor": "1767225600.5"})
    assert Event.objects.get(deployment=mine, seq=last).payload["text"] == "hello"
    with pytest.raises(PanelRefused) as refused:
        link.ship(theirs.pk, [("log", {"stream": "stdout", "text": "forged"})])
    assert refused.value.status == 404 and "placed on it" in refused.value.detail


def test_a_removed_host_cannot_come_back_with_its_old_token(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = services.jointoken_create(host_name="gpu-2").secret
    path = tmp_path / "c"
    _open(live_server, path, token)
    services.host_remove(name="gpu-2")
    with pytest.raises(PanelRefused) as refused:
        _open(live_server, path, token)
    assert refused.value.status == 403 and "revoked" in refused.value.detail
    assert not FleetHost.objects.exists()


def test_a_lost_credential_joins_again_with_a_fresh_token(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c"
    first = _open(live_server, path, services.jointoken_create(host_name="gpu-2").secret)
    path.unlink()
    second = _open(live_server, path, services.jointoken_create(host_name="gpu-2").secret)
    assert second.credential != first.credential
    with pytest.raises(PanelRefused) as refused:
        first.heartbeat(report())
    assert refused.value.status == 401


def test_without_a_credential_or_a_token_it_says_what_to_set(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PanelRefused, match="APPLIANCE_JOIN_TOKEN"):
        _open(live_server, tmp_path / "c", "")


class _Agent:
    """What a RemoteSink asks of its agent: the link, and where a refused credential goes."""

    def __init__(self, link: PanelLink) -> None:
        self.link = link
        self.refused: PanelRefused | None = None

    def credential_refused(self, exc: PanelRefused) -> None:
        self.refused = exc


class _LosingLink(PanelLink):
    """The panel stores the batch, then its answer is lost (the connection drops)."""

    lose = 0

    def ship_body(self, deployment_id: int, body: bytes) -> dict:  # type: ignore[type-arg]
        answer = super().ship_body(deployment_id, body)
        if self.lose:
            self.lose -= 1
            raise requests.ConnectionError("the answer was lost after the panel stored it")
        return answer


def _sink(link: PanelLink, pk: int) -> RemoteSink:
    [placement] = link.me()["placements"]
    assert placement["id"] == pk
    return RemoteSink(placement, _Agent(link), threading.Event(),  # type: ignore[arg-type]
                      Identity(str(pk)))


def _log(*texts: str) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    return [("log", {"stream": "stdout", "text": t}) for t in texts]


def _version(pk: int) -> str:
    return str(deployment_list(versioned=True).get(pk=pk).row_version)


def test_a_batch_sent_again_after_its_answer_was_lost_is_stored_once(  # type: ignore[no-untyped-def]
        live_server, tmp_path, live_channel) -> None:
    """As the panel's own agent keeps every line once across a PostgreSQL restart: a batch
    whose answer the host never got (stored, then the connection dropped) is sent again and
    the panel stores it once; so is one that moves no line, and each part of a batch split
    under the body limit."""
    token = services.jointoken_create(host_name="gpu-2").secret
    opened = _open(live_server, tmp_path / "c", token)
    link = _LosingLink(live_server.url, opened.credential, timeout_s=10)
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    sink = _sink(link, mine.pk)
    link.lose = 1
    sink.ship(_log("one", "two"), Cursor(100, 2))
    link.lose = 1
    sink.ship(_log("appliance: a note"), None)  # moves no line: a marked cursor
    big = [f"{i:05d} " + "x" * 1000 for i in range(1200)]  # over 512 KiB: three parts
    link.lose = 3
    sink.ship(_log(*big), Cursor(200, 1))
    sink.ship(_log("last"), Cursor(300, 1))
    assert link.lose == 0 and not sink.stop.is_set()
    texts = [e.payload["text"] for e in Event.objects.filter(deployment=mine, kind="log")
             .order_by("seq")]
    assert texts == ["one", "two", "appliance: a note", *big, "last"]
    mine.refresh_from_db()
    assert mine.log_cursor == "300:1" and sink.stored_cursor == "300:1"


def test_a_follower_behind_the_panels_cursor_stores_nothing_and_stops(  # type: ignore[no-untyped-def]
        live_server, tmp_path, live_channel) -> None:
    """Another process of the host stored lines after this follower read the cursor: its
    batch is not stored; it stops, and the next one resumes from the panel's cursor."""
    link = _open(live_server, tmp_path / "c", services.jointoken_create(host_name="gpu-2").secret)
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    behind = _sink(link, mine.pk)
    ahead = _sink(link, mine.pk)
    ahead.ship(_log("one"), Cursor(100, 1))
    with pytest.raises(PanelRefused) as moved:
        behind.ship(_log("one", "two"), Cursor(150, 1))
    assert moved.value.status == 409 and "'100:1'" in moved.value.detail
    assert behind.stop.is_set()
    assert Event.objects.filter(deployment=mine, kind="log").count() == 1
    # A batch of the same lines as the stored one ends at the same cursor: it is taken as
    # stored (what a batch sent again after its lost answer finds).
    late = _sink(link, mine.pk)
    late.stored_cursor = ""
    late.ship(_log("one"), Cursor(100, 1))
    assert not late.stop.is_set() and late.stored_cursor == "100:1"
    assert Event.objects.filter(deployment=mine, kind="log").count() == 1
    assert _sink(link, mine.pk).stored_cursor == "100:1"


def test_a_quiet_sink_has_the_panel_store_the_status_answers_once(  # type: ignore[no-untyped-def]
        live_server, tmp_path, live_channel) -> None:
    link = _open(live_server, tmp_path / "c", services.jointoken_create(host_name="gpu-2").secret)
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    sink = _sink(link, mine.pk)
    sink.ship(_log("Decode batch 1"), Cursor(100, 1))
    sink.ship(_log("Decode batch 2"), Cursor(200, 1))  # within STATUS_BODIES_EVERY_S
    assert StatusBody.objects.get(pk=mine.pk).version != _version(mine.pk)
    calls: list[int] = []
    quiet = link.quiet
    link.quiet = lambda pk: (calls.append(pk), quiet(pk))[1]  # type: ignore[method-assign]
    sink.idle()  # the follower's second without a batch
    assert StatusBody.objects.get(pk=mine.pk).version == _version(mine.pk)
    sink.idle()  # nothing shipped since: no call
    assert calls == [mine.pk]
