"""The panel has an icon: <link rel=icon> on every page, and /favicon.ico (asked by
browsers and tools that do not read the page) leads to it instead of a 404."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _body(response) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_favicon_ico_leads_to_the_icon_without_a_login() -> None:
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    icon = client.get(response["Location"])
    assert icon.status_code == 200 and icon["Content-Type"] == "image/svg+xml"
    svg = ET.fromstring(_body(icon))
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and svg.get("viewBox") == "0 0 32 32"


def test_every_page_names_the_icon(viewer) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    login_page = client.get("/login/").content.decode()
    client.force_login(viewer)
    for page in (login_page, client.get("/").content.decode()):
        link = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', page)
        assert link, page[:500]
        assert client.get(link.group(1)).status_code == 200


def test_favicon_ico_only_answers_reads() -> None:
    assert Client().post("/favicon.ico").status_code == 405
