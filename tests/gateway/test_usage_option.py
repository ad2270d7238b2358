"""The usage option the gateway adds to a stream the client asked no usage of: appended to
the body as the client wrote it where it can be, and the same request either way."""

from __future__ import annotations

import json

import pytest

from web.gateway.usage import with_usage_option

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "héllo " * 500}]}


@pytest.mark.parametrize("body", [
    json.dumps(CHAT).encode(),
    json.dumps(CHAT, ensure_ascii=False, indent=2).encode() + b"\n\t ",
    b"  " + json.dumps(CHAT, separators=(",", ":")).encode(),
])
def test_the_option_is_appended_to_the_body_as_written(body: bytes) -> None:
    out = with_usage_option(body, json.loads(body))
    assert out.startswith(body.rstrip()[:-1])  # the client's bytes, not encoded again
    assert json.loads(out) == {**CHAT, "stream_options": {"include_usage": True}}


def test_options_the_client_gave_are_kept() -> None:
    data = {**CHAT, "stream_options": {"continuous_usage_stats": True}}
    out = json.loads(with_usage_option(json.dumps(data).encode(), data))
    assert out["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert out["messages"] == CHAT["messages"]


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32"])
def test_a_body_in_another_encoding_is_encoded_again(encoding: str) -> None:
    body = json.dumps(CHAT).encode(encoding)
    out = with_usage_option(body, json.loads(body))  # json.loads reads these; appending would not
    assert json.loads(out) == {**CHAT, "stream_options": {"include_usage": True}}
