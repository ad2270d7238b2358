"""The deployment spec: one schema for the YAML file, the REST API and the panel form.

EngineOptions' field names are SGLang's flags in snake_case, so appliance.engine.launch maps
them mechanically (as SGLang's own ServerArgs does); cross-field checks live in
appliance.preflight.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from appliance.engine import bounds
from appliance.engine.bounds import ENV_NAME as ENV_NAME
from appliance.engine.bounds import SECRET_NAME as SECRET_NAME
from appliance.engine.bounds import SECRET_VALUE as SECRET_VALUE
from appliance.engine.errors import FieldError as FieldError
from appliance.engine.errors import SpecError as SpecError
from appliance.engine.extra_args import absorb, relocate
from appliance.engine.restart import RestartPolicy, restart_from
from appliance.engine.spec_fields import DEPLOYMENT_NAME as DEPLOYMENT_NAME
from appliance.engine.spec_fields import MAX_REPLICAS as MAX_REPLICAS
from appliance.engine.spec_fields import (
    env_from,
    gpus_from,
    label_from,
    name_from,
    recipe_from,
    replicas_from,
    secret_names,
)

SPECULATIVE_ALGORITHMS = ("NONE", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH",
                          "DDTREE")
# Algorithms whose verify runs the DFlash block drafter.
DFLASH_FAMILY = ("DFLASH", "DDTREE")
# Flags emitted even when they equal our default: the container must listen on them.
ALWAYS_EMITTED = ("host", "port")


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
    # The engine container's /dev/shm ("32g"); None: the appliance's APPLIANCE_ENGINE_SHM_SIZE.
    shm_size: str | None = None
    # Start the engine again after it died while serving (appliance.engine.restart); opt-in.
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    # Engines of this one spec, each on its own GPUs or host, behind the gateway's one name.
    replicas: int = 1
    # The fleet host to run on (its name on the Fleet page); None: the panel places it.
    host: str | None = None
    # A deployment of the same target without speculation, by name, that the gateway sends
    # the requests this engine refuses (log-probs, grammar, n > 1); None: those get a 400.
    companion: str | None = None


# ---------------------------------------------------------------- field introspection

def _engine_types() -> dict[str, Any]:
    return typing.get_type_hints(EngineOptions)


def engine_base_types() -> dict[str, type]:
    """Each engine option's type without None: what its flag's value must be."""
    return {k: _base_type(h)[0] for k, h in _engine_types().items()}


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
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        as_float = bounds.as_float(value)
        if as_float is None:
            return None, FieldError(where, f"is out of range ({len(str(value))} digits)",
                                    "write an ordinary number")
        return as_float, None
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        shown = repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"
        return None, FieldError(where, f"must be {_type_name(base)}, got {shown}",
                                f"write {where.split('.')[-1]} as {_type_name(base)}")
    return value, None


def _value_error(name: str, value: Any) -> FieldError | None:
    """The bound a single engine value breaks: length, range, finiteness."""
    where = f"engine.{name}"
    if isinstance(value, str):
        limit = bounds.MAX_PATH if name in bounds.PATH_FIELDS else bounds.MAX_TEXT
        return bounds.length_error(value, where, limit)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return bounds.int_range_error(name, value, where)
    return bounds.float_range_error(name, float(value), where)


def _range_errors(engine: EngineOptions) -> list[FieldError]:
    errors = [_value_error(f.name, getattr(engine, f.name)) for f in dataclasses.fields(engine)]
    return [e for e in errors if e is not None]


def _algorithm_error(engine: EngineOptions) -> FieldError | None:
    algo = engine.speculative_algorithm.upper()
    engine.speculative_algorithm = algo
    if algo in SPECULATIVE_ALGORITHMS:
        return None
    close = difflib.get_close_matches(algo, SPECULATIVE_ALGORITHMS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return FieldError("engine.speculative_algorithm", f"unknown algorithm {algo[:40]!r}",
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
    if not errors:
        algo_err = _algorithm_error(engine)
        errors += [algo_err] if algo_err else []
    if not engine.model_path:
        errors.append(FieldError("engine.model_path", "is required",
                                 "set engine.model_path to the model directory in the container"))
    return engine, errors


TOP_LEVEL_KEYS = ["name", "recipe", "gpus", "engine", "extra_args", "env", "secrets",
                  "self_check", "shm_size", "restart", "replicas", "host", "companion"]
def _engine_and_args(data: Mapping[str, Any], engine_defaults: Mapping[str, Any] | None,
                     ) -> tuple[EngineOptions, list[str], list[FieldError]]:
    """The engine options, with the typed flags of extra_args among them, and the rest."""
    extra, errors = bounds.str_list(data.get("extra_args"), "extra_args", '["--log-level", "info"]',
                              (bounds.MAX_EXTRA_ARGS, bounds.MAX_ARG))
    engine_data = data.get("engine")
    if not isinstance(engine_data, Mapping | None):
        engine, errs = _engine_from_dict(engine_data)
        return engine, extra, errors + errs
    explicit = dict(engine_data or {})
    taken = absorb(extra, engine_base_types(), explicit)
    engine, errs = _engine_from_dict({**(engine_defaults or {}), **explicit, **taken.values})
    return engine, taken.rest, errors + taken.errors + relocate(errs, taken.origin)


def spec_from_dict(data: Mapping[str, Any],
                   engine_defaults: Mapping[str, Any] | None = None) -> DeploymentSpec:
    """Validate a spec; raise SpecError listing every field error at once.

    engine_defaults (a recipe's recommended options) apply where the spec sets nothing;
    option flags in extra_args become engine options (appliance.engine.extra_args).
    """
    if not isinstance(data, Mapping):
        raise SpecError([FieldError("", "a spec must be a mapping",
                                    "write name:, recipe:, gpus:, engine: keys")])
    errors = _check_keys(data, TOP_LEVEL_KEYS, "") + bounds.text_errors(data, "")
    name, errs = name_from(data)
    recipe, errs2 = recipe_from(data)
    gpus, errs3 = gpus_from(data.get("gpus"))
    engine, extra, errs4 = _engine_and_args(data, engine_defaults)
    env, errs5 = env_from(data.get("env"))
    secrets, errs6 = secret_names(data.get("secrets"), env)
    shm_size, errs7 = bounds.shm_size_from(data.get("shm_size"))
    restart, errs8 = restart_from(data.get("restart"))
    replicas, errs9 = replicas_from(data.get("replicas"))
    host, errs10 = label_from(data.get("host"), "host", "gpu-host-1")
    companion, errs11 = label_from(data.get("companion"), "companion", "kimi-base")
    if companion is not None and companion == name:
        errs11.append(FieldError("companion", "names this deployment itself",
                                 "name another deployment of the same target without"
                                 " speculation, or leave it out"))
    errors += (errs + errs2 + errs3 + errs4 + errs5 + errs6 + errs7 + errs8 + errs9 + errs10
               + errs11)
    self_check = data.get("self_check", True)
    if not isinstance(self_check, bool):
        errors.append(FieldError("self_check", "must be true or false",
                                 "write self_check: true (the default) or false"))
    spec = DeploymentSpec(name=name, recipe=recipe, gpus=gpus, engine=engine, extra_args=extra,
                          env=env, secrets=secrets, self_check=bool(self_check),
                          shm_size=shm_size, restart=restart, replicas=replicas, host=host,
                          companion=companion)
    size_err = None if errors else bounds.launch_size_error(
        [*extra, *(f"{k}={v}" for k, v in env.items()),
         *(v for v in vars(engine).values() if isinstance(v, str))])
    if errors or size_err:
        raise SpecError(errors + ([size_err] if size_err else []))
    return spec


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
