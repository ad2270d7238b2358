"""JSON from outside, bounded in nesting (appliance/nesting.py)."""

from __future__ import annotations

import time

import pytest

from appliance.bench.prompts import PromptError, from_jsonl, from_sharegpt
from appliance.nesting import TooDeep, brackets_over, depth_over, json_loads_bounded


@pytest.mark.parametrize(("value", "depth"), [
    (1, 0), ([], 1), ({}, 1), ({"a": [1]}, 2), ([[], [[]]], 3), ({"a": {"b": {"c": []}}}, 4)])
def test_depth_over_counts_container_levels(value: object, depth: int) -> None:
    assert not depth_over(value, depth)
    assert depth_over(value, depth - 1) == (depth > 0)


@pytest.mark.parametrize("levels", [65, 900, 5_000, 100_000, 1_000_000])
def test_a_deep_document_is_too_deep_in_linear_time(levels: int) -> None:
    for text in ("[" * levels + "]" * levels, '{"a": ' * levels + "1" + "}" * levels):
        started = time.monotonic()
        with pytest.raises(TooDeep, match="nested deeper than 64 levels"):
            json_loads_bounded(text, limit=64)
        assert time.monotonic() - started < 2
    with pytest.raises(ValueError):  # never closed: malformed, or too deep where it recursed
        json_loads_bounded("[" * levels, limit=64)


def test_a_document_within_the_limit_parses_and_malformed_text_is_a_value_error() -> None:
    assert json_loads_bounded("[" * 64 + "]" * 64, limit=64)
    assert json_loads_bounded(b'{"a": "[[[[[[[[[["}', limit=1) == {"a": "[[[[[[[[[["}
    with pytest.raises(ValueError) as caught:
        json_loads_bounded("[[", limit=64)
    assert not isinstance(caught.value, TooDeep)


def test_brackets_over_counts_every_open_bracket_quoted_or_not() -> None:
    assert not brackets_over("[" * 64 + "]" * 64, 64)
    assert brackets_over("[" * 65, 64)
    assert brackets_over("'" + "{" * 65 + "'", 64)  # in a string too: a bound, not a parse
    assert not brackets_over("]" * 100 + "[" * 64, 64)  # closers first cannot go below 0


def test_a_deep_prompt_file_is_a_prompt_error_naming_the_limit() -> None:
    with pytest.raises(PromptError, match="line 2 is nested deeper than 16 levels"):
        from_jsonl('{"prompt": "a"}\n' + "[" * 5_000 + "]" * 5_000, output_len=4)
    with pytest.raises(PromptError, match="the file is nested deeper than 16 levels"):
        from_sharegpt("[" * 100_000, output_len=4)
