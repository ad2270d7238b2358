"""Prompt sources: a built-in synthetic set, a JSONL of prompts, a ShareGPT-format file."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from appliance.nesting import TooDeep, json_loads_bounded

# Common English words, each one token in the usual BPE vocabularies, so a synthetic
# prompt of N words is about N tokens without a tokenizer.
_VOCAB = ("the of and to in is that for it as was with be by on not he this are or his "
          "from at which but have an they you were her she there been one all we their has "
          "would when if so no will more can out up into do time only new some could these "
          "two may first then any like other than now over such our man me even most made "
          "after also did many before must through back years where much your way well down "
          "should because each just those people how too little state good very make world "
          "still own see men work long get here between both life being under never day same "
          "another know while last might us great old year off come since against go came "
          "right used take three")
_WORDS = tuple(_VOCAB.split())

SOURCES = ("synthetic", "jsonl", "sharegpt")
# A JSONL line is 1 level deep, a ShareGPT file 4: past this a file is no prompt file.
MAX_DEPTH = 16


class PromptError(ValueError):
    """A prompt file or option that cannot be used; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Prompt:
    text: str
    input_len: int  # tokens, as far as known without the server's count
    output_len: int  # max_tokens asked for

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "input_len": self.input_len, "output_len": self.output_len}


def synthetic(*, count: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    return [Prompt(" ".join(rng.choices(_WORDS, k=input_len)), input_len, output_len)
            for _ in range(count)]


def _approx_len(text: str) -> int:
    return max(1, len(text.split()))


def from_jsonl(text: str, *, output_len: int) -> list[Prompt]:
    """One JSON object per line: {"prompt": "...", "output_len": 128} (output_len optional)
    or a bare JSON string."""
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json_loads_bounded(line, limit=MAX_DEPTH)
        except TooDeep as exc:
            raise PromptError("prompts", f"line {number} is {exc}; a line is one "
                              '{"prompt": "..."} object') from None
        except json.JSONDecodeError as exc:
            raise PromptError("prompts", f"line {number} is not JSON: {exc.msg}") from exc
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise PromptError("prompts", f'line {number} has no "prompt" string')
        out = item.get("output_len", output_len)
        if not isinstance(out, int) or out < 1:
            raise PromptError("prompts", f"line {number}: output_len must be a positive integer")
        prompts.append(Prompt(item["prompt"], _approx_len(item["prompt"]), out))
    return prompts


def from_sharegpt(text: str, *, output_len: int | None) -> list[Prompt]:
    """ShareGPT: a list of {"conversations": [{"from": "human", "value": ...}, {"from":
    "gpt", ...}]}; the first turn is the prompt, the reply's length the output length (as
    sglang.bench_serving does), unless output_len fixes it."""
    try:
        data = json_loads_bounded(text, limit=MAX_DEPTH)
    except TooDeep as exc:
        raise PromptError("prompts", f"the file is {exc}; a ShareGPT file is a list of "
                          '{"conversations": [...]} (4 levels)') from None
    except json.JSONDecodeError as exc:
        raise PromptError("prompts", f"not a JSON file: {exc.msg}") from exc
    if not isinstance(data, list):
        raise PromptError("prompts", "a ShareGPT file is a JSON list of conversations")
    prompts = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") if isinstance(
            item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        ask, reply = (str(t.get("value", "")) if isinstance(t, dict) else "" for t in turns[:2])
        if not ask:
            continue
        out = output_len or max(4, _approx_len(reply))
        prompts.append(Prompt(ask, _approx_len(ask), out))
    return prompts


def load_prompts(*, source: str, count: int, input_len: int, output_len: int, seed: int,
                 text: str = "", fixed_output: bool = True) -> list[Prompt]:
    """`count` prompts from a source, sampled with `seed` (repeated when the file is short)."""
    if source == "synthetic":
        return synthetic(count=count, input_len=input_len, output_len=output_len, seed=seed)
    if source == "jsonl":
        pool = from_jsonl(text, output_len=output_len)
    elif source == "sharegpt":
        pool = from_sharegpt(text, output_len=output_len if fixed_output else None)
    else:
        raise PromptError("prompt_source", f"unknown source; use one of {', '.join(SOURCES)}")
    if not pool:
        raise PromptError("prompts", "the file holds no usable prompt")
    rng = random.Random(seed)
    return rng.sample(pool, count) if count <= len(pool) else rng.choices(pool, k=count)
