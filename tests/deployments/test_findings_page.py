"""Engine warnings that change what runs show on the deployment page as findings (severity,
summary, fix), one per cause, apart from a failure's diagnosis; the page names them from the
diagnosis events the agent stored (the parser's findings, appliance.logs.engine_warnings)."""

from __future__ import annotations

import pytest
from django.test import Client

from appliance.logs.engine_warnings import match_engine_warning
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment

pytestmark = pytest.mark.django_db
BLOCK_LINE = ("DFLASH block size mismatch: using speculative_num_draft_tokens=4 but draft "
              "config block_size=8.")


def _finding() -> dict[str, object]:
    found = match_engine_warning(BLOCK_LINE)
    assert found is not None
    return {**found.to_dict(), "fatal": False}


def test_a_stored_engine_warning_is_a_finding_on_the_page_with_its_severity_and_fix(
        operator) -> None:  # type: ignore[no-untyped-def]
    d = deploying.deployment_create(data=spec(), confirm_warnings=True)
    finding = _finding()
    services.events_append(deployment_id=d.pk, events=[
        ("diagnosis", finding), ("diagnosis", finding),  # eight ranks, one finding
        ("diagnosis", {"cause": "cuda-oom-capture", "summary": "out of memory", "fix": "lower",
                       "evidence": {}, "fatal": True}),
    ])
    client = Client()
    client.force_login(operator)
    page = client.get(f"/deployments/{d.pk}/").content.decode()
    card = page.split('id="findings"', 1)[1].split("</section>", 1)[0]
    assert card.count('data-cause="dflash-block-size-mismatch"') == 1
    assert "<b>warning</b>" in card
    assert "4 draft tokens per block" in card and "block size 8" in card
    assert "engine.speculative_num_draft_tokens" in card and "cuda-oom-capture" not in card


def test_the_findings_card_is_hidden_without_findings(operator) -> None:  # type: ignore[no-untyped-def]
    d = deploying.deployment_create(data=spec(), confirm_warnings=True)
    client = Client()
    client.force_login(operator)
    page = client.get(f"/deployments/{Deployment.objects.get(pk=d.pk).pk}/").content.decode()
    assert '<section class="card" id="findings" hidden>' in page
