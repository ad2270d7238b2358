"""A placement whose stored spec no longer reads (an older panel wrote it) keeps its host's
other engines going: the host API answers, and the agent is told why it may not start it."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.rows import queued, ready
from web.deployments.models import Deployment
from web.fleet import services

from .hosts import joined

pytestmark = pytest.mark.django_db


def test_a_placed_row_with_an_unreadable_spec_is_refused_and_the_others_are_answered() -> None:
    host = joined("gpu-2")
    good, broken = ready(), queued(name="broken", gpus=[1])
    services.placement_assign(deployment=good, host_name="gpu-2")
    services.placement_assign(deployment=broken, host_name="gpu-2")
    Deployment.objects.filter(pk=broken.pk).update(status="starting", start_token="s",
                                                   spec={"name": "broken"})
    answer = Client().get("/api/fleet/host/", HTTP_AUTHORIZATION=f"Bearer {host.credential}")
    assert answer.status_code == 200, answer.content[:300]
    rows = {row["id"]: row for row in answer.json()["placements"]}
    assert set(rows) == {good.pk, broken.pk}
    assert rows[good.pk]["models_refused"] == []
    [why] = rows[broken.pk]["models_refused"]
    assert "stored spec does not read" in why and "recipe: is required" in why
