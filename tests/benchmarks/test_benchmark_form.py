"""The new-benchmark form's choice of deployments: each ready deployment once, its replica
rows counted on it rather than offered as deployments of their own."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.rows import queued
from web.deployments import services
from web.deployments.models import Deployment

pytestmark = pytest.mark.django_db


def _ready(pk: int) -> None:
    services.deployment_mark_starting(deployment_id=pk, image="img", start_token=f"t{pk}")
    services.deployment_mark_ready(deployment_id=pk)
    Deployment.objects.filter(pk=pk).update(engine_url=f"http://engine-{pk}:30000")


def test_a_deployment_with_replicas_is_one_choice_naming_its_replica_count(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(name="fleet", gpus=[0], replicas=3)
    single = queued(name="solo", gpus=[4], engine__speculative_algorithm="NONE")
    for row in [first, *Deployment.objects.filter(replica_of=first), single]:
        _ready(row.pk)
    client = Client()
    client.force_login(operator)
    for url in ("/benchmarks/new/", "/benchmarks/verifications/new/"):
        page = client.get(url)
        assert page.status_code == 200, url
    html = client.get("/benchmarks/new/").content.decode()
    boxes = re.findall(r'name="deployments" value="(\d+)"', html)
    assert sorted(boxes) == sorted([str(first.pk), str(single.pk)])
    assert f"#{first.pk} fleet (DDTREE, 3 replicas)" in html
    assert f"#{single.pk} solo (NONE)</label>" in html
