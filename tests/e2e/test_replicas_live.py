"""The deployment page's Replicas table updates live, as a user watching it sees (Chromium ->
uvicorn panel -> PostgreSQL): a replica whose host turns lost reads `unknown` without a
reload, `ready` again once it reports; a replica that moves (a rolling restart's stop and
start) shows each status as it happens; the heading follows a Scale."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from tests.e2e.conftest import AGENT_SILENT_S as SILENT_S
from tests.e2e.stack import login, meanwhile
from tests.hostrows import host_reported
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
ASK_S = 5  # detail.js AGENT_ASK_MS: the page asks at least this often


@pytest.fixture
def server(shared_panel: str, live_channel: Any) -> str:
    return shared_panel  # its agent-silent threshold is SILENT_S


def _report(agent: str, *, age_s: float) -> None:
    host_reported(name=agent.split("@")[1], agent_id=agent,
                  heartbeat_at=timezone.now() - timedelta(seconds=age_s))


@pytest.fixture
def replicated(operator: Any) -> list[int]:
    """Three ready replicas: 0 and 1 watched by agent@sim-a, 2 by agent@sim-b."""
    first = deploying.deployment_create(data=spec(replicas=3), confirm_warnings=True)
    rows = [first.pk, *Deployment.objects.filter(replica_of=first)
            .order_by("replica_index").values_list("pk", flat=True)]
    for pk, agent in zip(rows, ("agent@sim-a", "agent@sim-a", "agent@sim-b"), strict=True):
        services.deployment_mark_starting(deployment_id=pk, image="img", start_token=f"t{pk}")
        services.deployment_mark_ready(deployment_id=pk)
        Deployment.objects.filter(pk=pk).update(agent_id=agent)
    _report("agent@sim-a", age_s=0)
    _report("agent@sim-b", age_s=0)
    return rows


def test_the_replicas_table_shows_a_lost_host_and_a_replicas_moves_without_a_reload(
        server: str, replicated: list[int], page: Page) -> None:
    login(page, server)
    page.goto(f"{server}/deployments/{replicated[0]}/")
    row = page.locator('#replica-rows tr[data-replica="2"] .status')
    expect(row).to_have_text("ready")
    page.evaluate("window.__kept = document.getElementById('status')")  # no reload: kept

    meanwhile(lambda: _report("agent@sim-b", age_s=SILENT_S + 5))
    expect(row).to_have_text("unknown", timeout=(ASK_S + 5) * 1000)
    expect(page.locator('#replica-rows tr[data-replica="1"] .status')).to_have_text("ready")
    expect(page.locator("#status")).to_have_text("ready")  # replica 0's own agent reports
    meanwhile(lambda: _report("agent@sim-b", age_s=0))
    expect(row).to_have_text("ready", timeout=(ASK_S + 5) * 1000)

    # Replica 1 stopped and started again (a rolling restart's steps), seen as they happen.
    one = page.locator('#replica-rows tr[data-replica="1"] .status')
    meanwhile(lambda: services.deployment_stop(deployment_id=replicated[1]))
    expect(one).to_have_text("stopping", timeout=(ASK_S + 5) * 1000)
    meanwhile(lambda: services.deployment_mark_stopped(deployment_id=replicated[1]))
    expect(one).to_have_text("stopped", timeout=(ASK_S + 5) * 1000)
    assert page.evaluate("window.__kept === document.getElementById('status')"), "reloaded"
