"""Export JSON, as a browser follows the link on a benchmark's or a losslessness check's
page: the JSON file, as an attachment, never the browsable API's HTML page under a .json
name (the Accept a browser sends asks for HTML first)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from web.benchmarks.models import BenchmarkRun
from web.benchmarks.verification_models import VerificationRun

pytestmark = pytest.mark.django_db

BROWSER_ACCEPT = ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,"
                  "image/webp,*/*;q=0.8")


def _exported(client: Client, page_url: str, filename: str) -> dict:  # type: ignore[type-arg]
    page = client.get(page_url, HTTP_ACCEPT=BROWSER_ACCEPT).content.decode()
    link = re.search(r'<a id="export-json" href="([^"]+)"', page)
    assert link, "the page links its JSON export"
    answer = client.get(link.group(1), HTTP_ACCEPT=BROWSER_ACCEPT)
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("application/json")
    assert answer["Content-Disposition"] == f'attachment; filename="{filename}"'
    assert not answer.content.lstrip().startswith(b"<")
    return dict(json.loads(answer.content))


def test_a_benchmarks_export_json_link_downloads_json_in_a_browser(viewer) -> None:  # type: ignore[no-untyped-def]
    run = BenchmarkRun.objects.create(name="ab", config={"levels": [1]},
                                      results={"speedups": [{"concurrency": 1}]})
    client = Client()
    client.force_login(viewer)
    data = _exported(client, f"/benchmarks/{run.pk}/", f"benchmark-{run.pk}.json")
    assert data["id"] == run.pk and data["results"] == {"speedups": [{"concurrency": 1}]}


def test_a_losslessness_checks_export_json_link_downloads_json_in_a_browser(viewer) -> None:  # type: ignore[no-untyped-def]
    run = VerificationRun.objects.create(name="check", config={"max_tokens": 8},
                                         results={"match_rate": 1.0})
    client = Client()
    client.force_login(viewer)
    data = _exported(client, f"/benchmarks/verifications/{run.pk}/",
                     f"verification-{run.pk}.json")
    assert data["id"] == run.pk and data["results"] == {"match_rate": 1.0}
