"""The bounds of every spec value: string lengths, numeric ranges, list sizes, the
characters a string may hold, the environment names an engine may be given, and the
shapes of credentials that never belong in a spec.

Every limit is far above any real deployment and far below what breaks something: a
database column, PostgreSQL's bigint, float's range, Linux's 128 KiB per argv or env
string and its ~2 MiB for all of them together (ARG_MAX).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from appliance.engine.errors import FieldError

MAX_PATH = 4096  # PATH_MAX
MAX_TEXT = 256  # a name, a backend, a parser, a log level
MAX_RECIPE = 200
MAX_GPUS = 64  # ids in one spec
MAX_GPU_ID = 1023
MAX_EXTRA_ARGS = 256
MAX_ARG = 4096  # one extra_args item
MAX_ENV = 128  # entries
MAX_ENV_NAME = 128
MAX_ENV_VALUE = 16384
MAX_SECRETS = 32
# argv and env together, well under ARG_MAX: the engine's own argv, the self-check's
# arguments and the secrets come on top.
MAX_LAUNCH_BYTES = 128 * 1024
INT32_MAX = 2**31 - 1

PATH_FIELDS = ("model_path", "tokenizer_path", "speculative_draft_model_path")
# Engine integers: (lowest, highest). chunked_prefill_size -1 turns chunking off in SGLang;
# a DDTree budget of 0 is left to the ddtree-budget rule, which says why it is wrong.
INT_RANGES: dict[str, tuple[int, int]] = {
    "tp_size": (1, 1024), "dp_size": (1, 1024), "pp_size": (1, 1024), "ep_size": (1, 1024),
    "speculative_num_draft_tokens": (1, 1024), "speculative_dflash_block_size": (1, 1024),
    "speculative_ddtree_budget": (0, 4096), "speculative_num_steps": (1, 1024),
    "speculative_eagle_topk": (1, 1024), "cuda_graph_max_bs": (1, 65536),
    "context_length": (1, INT32_MAX), "max_running_requests": (1, 1_000_000),
    "chunked_prefill_size": (-1, INT32_MAX), "page_size": (1, 65536),
    "decode_log_interval": (1, 1_000_000), "port": (1, 65535),
}
# Floats: (lowest, highest), both exclusive.
FLOAT_RANGES: dict[str, tuple[float, float]] = {"mem_fraction_static": (0.0, 1.0)}
# Larger than any float: 10**4000 is refused here rather than overflowing float().
FLOAT_ABS_MAX = 1e300

SECRET_NAME = re.compile(
    # TOKENIZERS_PARALLELISM and *_MAX_TOKENS are knobs, not credentials.
    r"(TOKEN(?!IZER|S(?:_|$))|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIAL)",
    re.IGNORECASE)
# Known token shapes (HF, OpenAI-style, GitHub, AWS, Slack, JWT): a value holding one is a
# credential whatever the key is called, however it is padded, quoted or prefixed.
_TOKEN_SHAPES = (
    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_.-]*")
# Where a token may start and end: the value's edges or a separator, never inside a path
# ("/models/sk-llama-..." is a directory, not a key).
_BEFORE = r"(?:^|(?<=[\s\"'`=:,;]))"
_AFTER = r"(?=$|[\s\"'`,;])"
# `.match` finds a token anywhere (the leading `.*?`), as callers have always used it; an HTTP
# credential ("Bearer x", "Basic x", "Token x") counts whatever its shape.
SECRET_VALUE = re.compile(
    rf"^.*?(?:{_BEFORE}(?:{_TOKEN_SHAPES}){_AFTER}"
    rf"|{_BEFORE}(?i:bearer|basic)\s+\S{{8,}}|{_BEFORE}(?i:token)\s+[A-Za-z0-9_.-]{{20,}})",
    re.DOTALL)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables that make the dynamic loader, a shell or an interpreter run code or load
# libraries of the caller's choosing, and the appliance's own settings for the container.
REFUSED_ENV = frozenset({
    "PATH", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4", "PROMPT_COMMAND",
    "CDPATH", "GLOBIGNORE", "HOME", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
    "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONWARNINGS", "PYTHONBREAKPOINT",
    "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS",
    "NODE_PATH", "GCONV_PATH", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS",
    "NLSPATH", "TMPDIR", "MALLOC_CHECK_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
})
REFUSED_ENV_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "APPLIANCE_", "PYTHONMALLOC")


def looks_like_secret(value: str) -> bool:
    """A credential however padded, quoted, prefixed ("Bearer ...") or embedded (k=v)."""
    return SECRET_VALUE.match(value) is not None


def env_name_error(key: str, where: str) -> FieldError | None:
    """Why an engine (or secret) environment name is refused, or None."""
    if len(key) > MAX_ENV_NAME or not ENV_NAME.fullmatch(key):
        return FieldError(where, "is not a valid environment variable name",
                          f"use letters, digits and underscores, at most {MAX_ENV_NAME}")
    upper = key.upper()
    if upper in REFUSED_ENV or upper.startswith(REFUSED_ENV_PREFIXES):
        return FieldError(where, f"{key} is refused: it changes how the loader, a shell or "
                          "Python starts (or is the appliance's own), so it could run code in "
                          "the engine container or take its GPUs",
                          f"remove {key} from env; set the engine's behaviour through engine "
                          "options or extra_args instead")
    return None


# ---------------------------------------------------------------- characters and lengths

def _bad_char(value: str) -> str | None:
    for ch in value:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029):
            return ch
    return None


def _char_error(value: str, where: str) -> FieldError | None:
    ch = _bad_char(value)
    if ch is None:
        return None
    if ch == "\x00":
        return FieldError(where, "contains a NUL character (\\x00)", "remove the NUL character")
    return FieldError(where, f"contains a control character ({ch!r})",
                      "remove it: no newline, tab or other control character is allowed")


def text_errors(value: Any, where: str, depth: int = 0) -> list[FieldError]:
    """Control characters in any string of a spec, its keys included.

    The spec is at most three levels deep; deeper values are type errors found elsewhere,
    so the walk stops there (a hostile nesting cannot exhaust the stack).
    """
    if isinstance(value, str):
        err = _char_error(value, where or "spec")
        return [err] if err else []
    if depth > 3:
        return []
    if isinstance(value, Mapping):
        return [e for k, v in value.items() for e in
                text_errors(k, where or "spec", depth + 1)
                + text_errors(v, f"{where}.{k}".lstrip("."), depth + 1)]
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in text_errors(v, f"{where}[{i}]", depth + 1)]
    return []


def length_error(value: str, where: str, limit: int) -> FieldError | None:
    if len(value) <= limit:
        return None
    return FieldError(where, f"is {len(value)} characters long; the limit is {limit}",
                      f"shorten it to at most {limit} characters")


def str_list(data: Any, where: str, example: str, limits: tuple[int, int],
              ) -> tuple[list[str], list[FieldError]]:
    """A list of strings of at most limits[0] items, each at most limits[1] characters."""
    if data is None:
        return [], []
    if not isinstance(data, list) or not all(isinstance(a, str) for a in data):
        return [], [FieldError(where, "must be a list of strings (one argv item each)",
                               f"write {where}: {example}")]
    if len(data) > limits[0]:
        return [], [FieldError(where, f"has {len(data)} items; at most {limits[0]}",
                               "keep the list short")]
    errors = [length_error(a, f"{where}[{i}]", limits[1]) for i, a in enumerate(data)]
    return list(data), [e for e in errors if e is not None]


def launch_size_error(strings: list[str]) -> FieldError | None:
    """argv and env together must fit the kernel's limits with room to spare."""
    size = sum(len(s.encode()) + 1 for s in strings)
    if size <= MAX_LAUNCH_BYTES:
        return None
    return FieldError("spec", f"extra_args, env and engine paths add up to {size} bytes; the "
                      f"limit is {MAX_LAUNCH_BYTES}",
                      "shorten them (the engine's command line would not start)")


# ---------------------------------------------------------------- numbers

def int_range_error(name: str, value: int, where: str) -> FieldError | None:
    low, high = INT_RANGES.get(name, (-INT32_MAX, INT32_MAX))
    if low <= value <= high:
        return None
    shown = str(value) if len(str(value)) <= 24 else f"a {len(str(value))}-digit number"
    return FieldError(where, f"must be between {low} and {high}, got {shown}",
                      f"set {name} between {low} and {high}, or leave it out")


def float_range_error(name: str, value: float, where: str) -> FieldError | None:
    low, high = FLOAT_RANGES.get(name, (-FLOAT_ABS_MAX, FLOAT_ABS_MAX))
    if math.isfinite(value) and low < value < high:
        return None
    return FieldError(where, f"must be between {low:g} and {high:g} (exclusive), got {value:g}",
                      "use a fraction such as 0.85" if high == 1.0 else f"set {name} in range")


def as_float(value: int) -> float | None:
    """An integer as a float, or None when it is beyond any sensible float."""
    return float(value) if abs(value) <= FLOAT_ABS_MAX else None


# ---------------------------------------------------------------- /dev/shm

SHM_SIZE = re.compile(r"([1-9][0-9]{0,6})([mgt])", re.IGNORECASE)
SHM_MIN_BYTES = 64 * 2**20  # Docker's own default; NCCL wants far more with several GPUs
SHM_MAX_BYTES = 2 * 2**40
_SHM_UNIT = {"m": 2**20, "g": 2**30, "t": 2**40}


def shm_size_from(data: Any) -> tuple[str | None, list[FieldError]]:
    """The engine container's /dev/shm size ("32g"), None for the appliance's default
    (APPLIANCE_ENGINE_SHM_SIZE), or why it is refused."""
    if data is None:
        return None, []
    match = SHM_SIZE.fullmatch(data) if isinstance(data, str) else None
    size = int(match[1]) * _SHM_UNIT[match[2].lower()] if match else 0
    if not SHM_MIN_BYTES <= size <= SHM_MAX_BYTES:
        shown = repr(data) if len(repr(data)) <= 40 else "a long value"
        return None, [FieldError("shm_size", f"must be a size from 64m to 2t, got {shown}",
                                 'write shm_size: "32g" (NCCL over 8 GPUs wants 16g or more)')]
    return data.lower(), []
