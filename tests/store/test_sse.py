"""An entry's event stream: the whole entry per frame, ending after a terminal state."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from web.store.models import ModelEntry, ModelFile, ModelState

pytestmark = pytest.mark.django_db(transaction=True)


async def _frames(client: AsyncClient, url: str) -> list[dict]:  # type: ignore[type-arg]
    response = await client.get(url)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    body = b"".join([chunk async for chunk in response.streaming_content])
    return [json.loads(line[6:]) for line in body.decode().splitlines()
            if line.startswith("data: ")]


def _entry(state: str) -> ModelEntry:
    entry = ModelEntry.objects.create(root="/r", relative_path="acme/m", source="hub",
                                      repo_id="acme/m", revision="main", state=state,
                                      size_bytes=100, bytes_done=100)
    ModelFile.objects.create(entry=entry, path="model.safetensors", size_bytes=100,
                             bytes_done=100, state="ready", sha256_expected="ab" * 32)
    return entry


def test_a_finished_entry_streams_one_frame_with_its_files_and_ends(viewer) -> None:  # type: ignore[no-untyped-def]
    entry = _entry(ModelState.READY)
    client = AsyncClient()
    client.force_login(viewer)
    (frame,) = asyncio.run(_frames(client, f"/models/{entry.pk}/events"))
    assert frame["state"] == "ready" and frame["usable"] is True
    assert frame["bytes_done"] == frame["size_bytes"] == 100
    assert frame["files"][0]["path"] == "model.safetensors"


def test_the_stream_needs_a_login_and_an_entry(viewer) -> None:  # type: ignore[no-untyped-def]
    assert asyncio.run(AsyncClient().get("/models/1/events")).status_code == 401
    client = AsyncClient()
    client.force_login(viewer)
    assert asyncio.run(client.get("/models/999999/events")).status_code == 404
