"""The status reads' bodies on the fast path: the detail is DeploymentSerializer's output byte
for byte, however it is made on the hot path (web/deployments/serializers.py deployment_data), for a
deployment with every kind of value a serving one carries."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment
from web.deployments.serializers import DeploymentSerializer

pytestmark = pytest.mark.django_db


def _serving(deployment: Deployment) -> Deployment:
    """Times with and without microseconds, nulls, nested JSON, non-ASCII and U+2028 text."""
    Deployment.objects.filter(pk=deployment.pk).update(
        status="ready", phase="serving", engine_url="http://engine:30000",
        ready_at=datetime(2026, 12, 1, 13, 0, 0, tzinfo=UTC),
        restart_not_before=datetime(2026, 12, 1, 13, 0, 0, 123456, tzinfo=UTC),
        progress={"widths": {"target": {"captured": 33}}, "ratio": 0.1 + 0.2},
        decode_stats={"accept_len": 4.25, "throughput": 1e16},
        last_lines=["Décodage \u2028 fini", "<script>&"], diagnosis=None)
    return Deployment.objects.get(pk=deployment.pk)


def test_the_detail_is_the_deployment_serializers_output_byte_for_byte(
        viewer: Any, token_for: Any) -> None:
    deployment = _serving(deploying.deployment_create(data=spec(), confirm_warnings=True))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    answer = api.get(f"/api/deployments/{deployment.pk}/")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    expected = JSONRenderer().render(DeploymentSerializer(deployment).data)
    assert answer.content == expected
    assert b'"ready_at":"2026-12-01T13:00:00Z"' in answer.content
