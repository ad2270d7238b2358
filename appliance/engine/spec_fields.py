"""The deployment spec's top-level fields, each read on its own (appliance/engine/spec.py
puts them together): the GPUs, the environment and the secrets' names (never their
values), the name, the recipe, the replicas and the optional host and companion labels.
Each gives its value and the FieldErrors that name what is wrong and how to fix it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from appliance.engine import bounds
from appliance.engine.bounds import ENV_NAME, SECRET_NAME, SECRET_VALUE
from appliance.engine.errors import FieldError

DEPLOYMENT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
SECRET_NAME_FORM = re.compile(r"[A-Z_][A-Z0-9_]*")


def gpus_from(data: Any) -> tuple[list[int], list[FieldError]]:
    if not isinstance(data, list) or not data:
        return [], [FieldError("gpus", "must be a non-empty list of GPU ids",
                               "write gpus: [0, 1, 2, 3, 4, 5, 6, 7]")]
    if len(data) > bounds.MAX_GPUS:
        return [], [FieldError("gpus", f"lists {len(data)} GPUs; at most {bounds.MAX_GPUS}",
                               "list the GPUs of this host the engine uses")]
    if not all(isinstance(g, int) and not isinstance(g, bool)
               and 0 <= g <= bounds.MAX_GPU_ID for g in data):
        bad = [g for g in data if not isinstance(g, int) or not 0 <= g <= bounds.MAX_GPU_ID]
        return [], [FieldError("gpus", f"GPU ids are integers from 0 to {bounds.MAX_GPU_ID}, "
                               f"got {str(bad[:5])[:80]}", "write gpus: [0, 1, 2, 3]")]
    dupes = sorted({g for g in data if data.count(g) > 1})
    if dupes:
        return [], [FieldError("gpus", f"GPU ids listed twice: {dupes}", "list each GPU once")]
    return list(data), []


def _env_item(key: Any, value: Any) -> tuple[str | None, FieldError | None]:
    """(the value as a string, or why the entry is refused)."""
    where = f"env.{str(key)[:bounds.MAX_ENV_NAME]}"
    name_err = bounds.env_name_error(key, where) if isinstance(key, str) else \
        FieldError(where, "is not a valid environment variable name", "use a string")
    if name_err:
        return None, name_err
    if isinstance(value, bool) or not isinstance(value, str | int | float) or \
            (isinstance(value, int) and abs(value) > 10**18):
        shown = repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"
        return None, FieldError(where, f"value must be a string, got {shown}",
                                f'quote it: {key}: "..."')
    text = str(value)
    if SECRET_NAME.search(key) or SECRET_VALUE.match(text):
        return None, FieldError(where, "looks like a secret; secrets never go in the spec",
                                f"store it as a secret and list {key!r} under secrets:")
    return text, bounds.length_error(text, where, bounds.MAX_ENV_VALUE)


def env_from(data: Any) -> tuple[dict[str, str], list[FieldError]]:
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        return {}, [FieldError("env", "must be a mapping of names to strings",
                               "write env: {NCCL_DEBUG: WARN}")]
    if len(data) > bounds.MAX_ENV:
        return {}, [FieldError("env", f"has {len(data)} entries; at most {bounds.MAX_ENV}",
                               "keep only the variables the engine needs")]
    errors: list[FieldError] = []
    env: dict[str, str] = {}
    for key, value in data.items():
        text, err = _env_item(key, value)
        if err:
            errors.append(err)
        elif text is not None:
            env[key] = text
    return env, errors


def secret_names(data: Any, env: Mapping[str, str]) -> tuple[list[str], list[FieldError]]:
    names, errors = bounds.str_list(data, "secrets", "[HF_TOKEN]",
                              (bounds.MAX_SECRETS, bounds.MAX_ENV_NAME))
    for name in names:
        err = bounds.env_name_error(name, "secrets")
        # Upper case only: the store's folder may sit beside lower-case files of its own.
        if (err and not ENV_NAME.fullmatch(name)) or not SECRET_NAME_FORM.fullmatch(name):
            err = FieldError("secrets", f"not an upper-case variable name: {name[:40]!r}",
                             "list secret names such as HF_TOKEN, never their values")
        errors += [err] if err else []
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        errors.append(FieldError("secrets", f"listed twice: {dupes}", "list each secret once"))
    clash = sorted(set(names) & set(env))
    if clash:
        errors.append(FieldError("secrets", f"also set under env: {clash}",
                                 "keep the name under secrets: and remove it from env"))
    return names, errors


def name_from(data: Mapping[str, Any]) -> tuple[str, list[FieldError]]:
    name = data.get("name")
    # fullmatch: `$` would also accept a trailing newline.
    if not isinstance(name, str) or not DEPLOYMENT_NAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 80 else "a long value"
        return "", [FieldError("name", f"must be a lowercase DNS label, got {shown}",
                               "use lowercase letters, digits and dashes, e.g. kimi-ddtree")]
    return name, []


def recipe_from(data: Mapping[str, Any]) -> tuple[str, list[FieldError]]:
    recipe = data.get("recipe")
    if not isinstance(recipe, str) or not recipe.strip():
        return "", [FieldError("recipe", "is required",
                               "name a recipe (e.g. kimi-k2.6-dflash) or a recipe file path")]
    err = bounds.length_error(recipe, "recipe", bounds.MAX_RECIPE)
    return recipe, [err] if err else []


# Replicas of one spec: a fleet of 16 hosts of 8 GPUs at one GPU a replica is 128.
MAX_REPLICAS = 128


def replicas_from(data: Any) -> tuple[int, list[FieldError]]:
    if data is None:
        return 1, []
    if isinstance(data, bool) or not isinstance(data, int) or not 1 <= data <= MAX_REPLICAS:
        shown = repr(data) if len(repr(data)) <= 40 else "a long value"
        return 1, [FieldError("replicas", f"must be a whole number from 1 to {MAX_REPLICAS},"
                                          f" got {shown}",
                              "write replicas: 1 for one engine, or more for engines behind"
                              " one name")]
    return data, []


def label_from(data: Any, key: str, example: str) -> tuple[str | None, list[FieldError]]:
    """An optional host or deployment name: a lowercase DNS label."""
    if data is None or data == "":
        return None, []
    if not isinstance(data, str) or not DEPLOYMENT_NAME.fullmatch(data):
        shown = repr(data) if len(repr(data)) <= 80 else "a long value"
        return None, [FieldError(key, f"must be a lowercase DNS label, got {shown}",
                                 f"write the name as the panel shows it, e.g. {example},"
                                 " or leave it out")]
    return data, []
