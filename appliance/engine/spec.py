"""The deployment spec: one schema for the YAML file, the REST API and the panel form.

EngineOptions' field names are SGLang's flags in snake_case, so appliance.engine.launch maps
them mechanically (as SGLang's own ServerArgs does); cross-field checks live in
appliance.preflight.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

SPECULATIVE_ALGORITHMS = ("NONE", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH",
                          "DDTREE")
# Algorithms whose verify runs the DFlash block drafter.
DFLASH_FAMILY = ("DFLASH", "DDTREE")
# Flags emitted even when they equal our default: the container must listen on them.
ALWAYS_EMITTED = ("host", "port")
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIAL)",
    re.IGNORECASE)
# Known token shapes (HF, OpenAI-style, GitHub, AWS, Slack, JWT); a value of this shape is a
# credential whatever the key is called.
SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\..*)$"
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEPLOYMENT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass
class EngineOptions:
    """SGLang server options; each field is `--<field-with-dashes>` on the command line."""

    model_path: str | None = None
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    trust_remote_code: bool = False
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    enable_dp_attention: bool = False
    enable_dp_lm_head: bool = False
    speculative_algorithm: str = "NONE"
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_dflash_block_size: int | None = None
    speculative_ddtree_budget: int | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    attention_backend: str | None = None
    speculative_draft_attention_backend: str | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    disable_overlap_schedule: bool = False
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    page_size: int | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    decode_log_interval: int | None = None
    log_level: str | None = None
    enable_metrics: bool = True
    host: str = "0.0.0.0"
    port: int = 30000


@dataclass
class DeploymentSpec:
    name: str
    recipe: str
    gpus: list[int]
    engine: EngineOptions = field(default_factory=EngineOptions)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Names of secrets (e.g. HF_TOKEN) the runtime injects as env vars; values never live here.
    secrets: list[str] = field(default_factory=list)
    # Run the GPU self-check (appliance.selfcheck) in the engine container before the load.
    self_check: bool = True


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class SpecError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))


# ---------------------------------------------------------------- field introspection

def _engine_types() -> dict[str, Any]:
    return typing.get_type_hints(EngineOptions)


def engine_field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(EngineOptions)]


def flag_for(field_name: str) -> str:
    """The SGLang flag of an engine field: snake_case -> --kebab-case."""
    return "--" + field_name.replace("_", "-")


def _base_type(hint: Any) -> tuple[type, bool]:
    """(the non-None type, whether None is allowed) of `X` or `X | None`."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


# ---------------------------------------------------------------- validation

def _unknown_key_error(path: str, key: str, valid: list[str]) -> FieldError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    where = f"{path}.{key}" if path else key
    if close:
        return FieldError(where, f"unknown key {key!r}; did you mean {close[0]!r}?",
                          f"rename {key!r} to {close[0]!r}")
    return FieldError(where, f"unknown key {key!r}",
                      f"remove it; valid keys: {', '.join(sorted(valid))}")


def _check_keys(data: Mapping[str, Any], valid: list[str], path: str) -> list[FieldError]:
    return [_unknown_key_error(path, str(k), valid) for k in data if k not in valid]


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[t]


def _coerce(value: Any, hint: Any, where: str) -> tuple[Any, FieldError | None]:
    """Check one engine value against its annotation; ints are accepted for floats."""
    base, nullable = _base_type(hint)
    if value is None:
        if nullable:
            return None, None
        return None, FieldError(where, "must not be empty", f"give {_type_name(base)}")
    ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value), None
    if not ok:
        return None, FieldError(where, f"must be {_type_name(base)}, got {value!r}",
                                f"write {where.split('.')[-1]} as {_type_name(base)}")
    return value, None


def _range_errors(engine: EngineOptions) -> list[FieldError]:
    errors: list[FieldError] = []
    for name in ("tp_size", "dp_size", "pp_size", "ep_size"):
        if getattr(engine, name) < 1:
            errors.append(FieldError(f"engine.{name}", "must be at least 1", f"set {name}: 1"))
    for name in ("speculative_num_draft_tokens", "speculative_dflash_block_size",
                 "cuda_graph_max_bs", "max_running_requests", "context_length", "page_size"):
        value = getattr(engine, name)
        if value is not None and value < 1:
            errors.append(FieldError(f"engine.{name}", f"must be at least 1, got {value}",
                                     f"set a positive {name} or leave it out"))
    if not 1 <= engine.port <= 65535:
        errors.append(FieldError("engine.port", f"port {engine.port} is out of range",
                                 "use a port between 1 and 65535, e.g. 30000"))
    frac = engine.mem_fraction_static
    if frac is not None and not 0.0 < frac < 1.0:
        errors.append(FieldError("engine.mem_fraction_static",
                                 f"must be between 0 and 1, got {frac}",
                                 "use a fraction such as 0.85"))
    return errors


def _algorithm_error(engine: EngineOptions) -> FieldError | None:
    algo = engine.speculative_algorithm.upper()
    engine.speculative_algorithm = algo
    if algo in SPECULATIVE_ALGORITHMS:
        return None
    close = difflib.get_close_matches(algo, SPECULATIVE_ALGORITHMS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return FieldError("engine.speculative_algorithm", f"unknown algorithm {algo!r}",
                      f"{hint}use one of {', '.join(SPECULATIVE_ALGORITHMS)}")


def _engine_from_dict(data: Any) -> tuple[EngineOptions, list[FieldError]]:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return EngineOptions(), [FieldError("engine", "must be a mapping of SGLang options",
                                            "write engine: {model_path: ..., tp_size: 8}")]
    hints = _engine_types()
    errors = _check_keys(data, list(hints), "engine")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in hints:
            coerced, err = _coerce(value, hints[key], f"engine.{key}")
            if err:
                errors.append(err)
            elif coerced is not None or _base_type(hints[key])[1]:
                values[key] = coerced
    engine = EngineOptions(**values)
    if not errors:
        errors += _range_errors(engine)
        algo_err = _algorithm_error(engine)
        errors += [algo_err] if algo_err else []
    if not engine.model_path:
        errors.append(FieldError("engine.model_path", "is required",
                                 "set engine.model_path to the model directory in the container"))
    return engine, errors


def _gpus_from(data: Any) -> tuple[list[int], list[FieldError]]:
    if not isinstance(data, list) or not data:
        return [], [FieldError("gpus", "must be a non-empty list of GPU ids",
                               "write gpus: [0, 1, 2, 3, 4, 5, 6, 7]")]
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in data):
        return [], [FieldError("gpus", f"GPU ids must be non-negative integers, got {data!r}",
                               "write gpus: [0, 1, 2, 3]")]
    dupes = sorted({g for g in data if data.count(g) > 1})
    if dupes:
        return [], [FieldError("gpus", f"GPU ids listed twice: {dupes}", "list each GPU once")]
    return list(data), []


def _str_list(data: Any, where: str, example: str) -> tuple[list[str], list[FieldError]]:
    if data is None:
        return [], []
    if not isinstance(data, list) or not all(isinstance(a, str) for a in data):
        return [], [FieldError(where, "must be a list of strings (one argv item each)",
                               f"write {where}: {example}")]
    return list(data), []


def _env_from(data: Any) -> tuple[dict[str, str], list[FieldError]]:
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        return {}, [FieldError("env", "must be a mapping of names to strings",
                               "write env: {NCCL_DEBUG: WARN}")]
    errors: list[FieldError] = []
    env: dict[str, str] = {}
    for key, value in data.items():
        where = f"env.{key}"
        if not isinstance(key, str) or not ENV_NAME.match(key):
            errors.append(FieldError(where, "is not a valid environment variable name",
                                     "use letters, digits and underscores"))
        elif not isinstance(value, str | int | float) or isinstance(value, bool):
            errors.append(FieldError(where, f"value must be a string, got {value!r}",
                                     f"quote it: {key}: \"{value}\""))
        elif SECRET_NAME.search(key) or SECRET_VALUE.match(str(value)):
            errors.append(FieldError(where, "looks like a secret; secrets never go in the spec",
                                     f"store it as a secret and list {key!r} under secrets:"))
        else:
            env[key] = str(value)
    return env, errors


def _secret_names(data: Any) -> tuple[list[str], list[FieldError]]:
    names, errors = _str_list(data, "secrets", "[HF_TOKEN]")
    bad = [n for n in names if not ENV_NAME.match(n)]
    if bad:
        errors.append(FieldError("secrets", f"not environment variable names: {bad}",
                                 "list secret names such as HF_TOKEN, never their values"))
    return names, errors


def _name_from(data: Mapping[str, Any]) -> tuple[str, list[FieldError]]:
    name = data.get("name")
    if not isinstance(name, str) or not DEPLOYMENT_NAME.match(name):
        return "", [FieldError("name", f"must be a lowercase DNS label, got {name!r}",
                               "use lowercase letters, digits and dashes, e.g. kimi-ddtree")]
    return name, []


def _recipe_from(data: Mapping[str, Any]) -> tuple[str, list[FieldError]]:
    recipe = data.get("recipe")
    if not isinstance(recipe, str) or not recipe.strip():
        return "", [FieldError("recipe", "is required",
                               "name a recipe (e.g. kimi-k2.6-dflash) or a recipe file path")]
    return recipe, []


TOP_LEVEL_KEYS = ["name", "recipe", "gpus", "engine", "extra_args", "env", "secrets",
                  "self_check"]


def _nul_errors(value: Any, where: str) -> list[FieldError]:
    """A NUL character in any text: no path, flag or environment value may hold one (the
    database refuses it, and argv and env strings end at it)."""
    if isinstance(value, str):
        return ([FieldError(where or "spec", "contains a NUL character (\\x00)",
                            "remove the NUL character")] if "\x00" in value else [])
    if isinstance(value, Mapping):
        return [e for k, v in value.items() for e in
                _nul_errors(k, where or "spec") + _nul_errors(v, f"{where}.{k}".lstrip("."))]
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in _nul_errors(v, f"{where}[{i}]")]
    return []


def spec_from_dict(data: Mapping[str, Any],
                   engine_defaults: Mapping[str, Any] | None = None) -> DeploymentSpec:
    """Validate a spec; raise SpecError listing every field error at once.

    engine_defaults (a recipe's recommended options) apply where the spec sets nothing.
    """
    if not isinstance(data, Mapping):
        raise SpecError([FieldError("", "a spec must be a mapping",
                                    "write name:, recipe:, gpus:, engine: keys")])
    errors = _check_keys(data, TOP_LEVEL_KEYS, "") + _nul_errors(data, "")
    name, errs = _name_from(data)
    errors += errs
    recipe, errs = _recipe_from(data)
    errors += errs
    gpus, errs = _gpus_from(data.get("gpus"))
    errors += errs
    engine_data = data.get("engine")
    if engine_defaults and isinstance(engine_data, Mapping | None):
        engine_data = {**engine_defaults, **(engine_data or {})}
    engine, errs = _engine_from_dict(engine_data)
    errors += errs
    extra, errs = _str_list(data.get("extra_args"), "extra_args", '["--log-level", "info"]')
    errors += errs
    env, errs = _env_from(data.get("env"))
    errors += errs
    secrets, errs = _secret_names(data.get("secrets"))
    errors += errs
    self_check = data.get("self_check", True)
    if not isinstance(self_check, bool):
        errors.append(FieldError("self_check", "must be true or false",
                                 "write self_check: true (the default) or false"))
    if errors:
        raise SpecError(errors)
    return DeploymentSpec(name=name, recipe=recipe, gpus=gpus, engine=engine, extra_args=extra,
                          env=env, secrets=secrets, self_check=bool(self_check))


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Parse a YAML spec file into a mapping; YAML and IO errors become SpecError."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SpecError([FieldError("", f"cannot read {path}: {exc.strerror}",
                                    "check the path")]) from exc
    except yaml.YAMLError as exc:
        raise SpecError([FieldError("", f"not valid YAML: {exc}", "fix the YAML syntax")]) from exc
    if not isinstance(data, dict):
        raise SpecError([FieldError("", "a spec file must hold a mapping",
                                    "write name:, recipe:, gpus:, engine: keys")])
    return data


def load_spec(path: str | Path) -> DeploymentSpec:
    return spec_from_dict(read_spec_file(path))


def spec_to_dict(spec: DeploymentSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)
