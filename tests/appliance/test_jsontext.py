"""The log path's compact JSON (appliance/jsontext.py): orjson's text where it writes one,
the standard library's where it refuses, and what the standard library reads, read."""

from __future__ import annotations

import json
import math

import pytest

from appliance import jsontext


@pytest.mark.parametrize(("value", "ascii"), [
    ({"stream": "stdout", "text": 'quote " backslash \\ tab \t newline \n é \u2028 😀 \x00'},
     False),
    (["metric", {"accept_len": 3.21, "cuda_graph": True, "tp": None, "tokens": 2 ** 63 - 1}],
     False),
    # What orjson refuses to write, the standard library writes, in ASCII.
    ({"ranks": {0: 1.5}}, True),  # a key that is not a string
    ({"tokens": 2 ** 70}, True),  # beyond 64 bits
    ({"text": "lone \ud800"}, True),  # no UTF-8 for it: its escape
])
def test_the_text_is_compact_json_that_reads_back_as_the_value(value, ascii) -> None:  # type: ignore[no-untyped-def]
    text = jsontext.dumps_text(value)
    assert jsontext.dumps(value) == text.encode()
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=ascii)
    assert json.loads(text) == json.loads(json.dumps(value))
    # Never a raw newline or tab: COPY's text rows and newline-joined lists hold it as is.
    assert "\n" not in text and "\t" not in text


def test_nan_and_infinity_are_read_and_written_back_as_they_came() -> None:
    value = jsontext.loads(b'{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1.5}')
    assert math.isnan(value["a"]) and value["b"] == math.inf and value["c"] == -math.inf
    assert isinstance(value["a"], jsontext.NonFinite) and type(value["d"]) is float
    # As the standard library wrote them, so PostgreSQL's jsonb refuses them as before.
    assert jsontext.dumps_text(value) == '{"a":NaN,"b":Infinity,"c":-Infinity,"d":1.5}'


def test_a_nan_the_agent_made_itself_goes_as_null() -> None:
    assert jsontext.dumps({"accept_rate": math.nan}) == b'{"accept_rate":null}'


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": 1,}', b"\xff", b"[" * 100_000])
def test_text_that_is_not_json_is_a_value_error(text: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)):
        jsontext.loads(text)
