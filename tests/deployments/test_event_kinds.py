"""The Event rows' kinds are appliance.events' stored kinds, and web reads the parser's
payloads through it (a payload of a kind it does not fold changes nothing)."""

from __future__ import annotations

import pytest

from appliance import events
from appliance.runtime.alerts import Alert
from appliance.runtime.progress import FOLDED_KINDS, progress_fold
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Event, EventKind
from web.deployments.services.metrics import deployment_apply_alerts


def test_the_event_rows_kinds_are_the_stored_kinds_appliance_events_lists() -> None:
    assert {kind.value for kind in EventKind} == events.STORED_KINDS


def test_the_folded_kinds_are_parser_kinds_and_others_leave_the_progress_as_it_was() -> None:
    assert FOLDED_KINDS <= events.ENGINE_KINDS
    progress = {"weights": {"done": 3, "total": 12, "finished": False}}
    assert not progress_fold(progress, {"line": 9, "kind": "decode_stats", "running_req": 1})
    assert not progress_fold(progress, {"kind": "graph_reloaded"})
    assert progress == {"weights": {"done": 3, "total": 12, "finished": False}}


@pytest.mark.django_db
def test_the_alert_rows_the_agent_stores_have_the_keys_alert_payload_names() -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    for state in ("firing", "resolved"):
        deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
            Alert("stall", state, "warning", f"stall {state}")])
    typed = events.AlertPayload
    rows = [e.payload for e in Event.objects.filter(deployment=deployment, kind="alert")]
    assert len(rows) == 2
    for payload in rows:
        assert typed.__required_keys__ <= set(payload)
        assert set(payload) <= typed.__required_keys__ | typed.__optional_keys__
