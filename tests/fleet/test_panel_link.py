"""A host's link to the panel (appliance.runtime.panel_link) against a live panel: join
once, keep the credential 0600, report, ship events; refused the way the panel says."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from appliance.runtime.panel_link import PanelRefused, panel_link_open
from tests.rows import ready
from web.deployments.models import Event
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
