"""Every spec value is bounded: names, strings, numbers, lists, GPU ids, environment names,
characters, credentials however they are dressed; option flags in extra_args are typed."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.engine import bounds
from appliance.engine.launch import launch_args
from appliance.engine.recipes import load_recipe
from appliance.engine.spec import SpecError, spec_from_dict
from appliance.preflight import run_preflight
from tests.specs import spec

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz12"


def errors_of(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    return {e.field: f"{e.message} {e.fix}" for e in info.value.errors}


def test_a_name_with_a_trailing_newline_is_refused() -> None:
    assert "DNS label" in errors_of(spec(name="kimi\n"))["name"]


@pytest.mark.parametrize(("key", "length"), [
    ("model_path", bounds.MAX_PATH + 1), ("speculative_draft_model_path", 1_000_000),
    ("attention_backend", bounds.MAX_TEXT + 1), ("served_model_name", 10_000)])
def test_every_engine_string_is_length_bounded(key: str, length: int) -> None:
    message = errors_of(spec(**{f"engine__{key}": "a" * length}))[f"engine.{key}"]
    assert "the limit is" in message


@pytest.mark.parametrize(("key", "value"), [
    ("mem_fraction_static", 10**4000), ("mem_fraction_static", float("inf")),
    ("mem_fraction_static", float("nan")), ("mem_fraction_static", 1e308),
    ("tp_size", 10**4000), ("context_length", 2**63), ("port", 70000), ("cuda_graph_max_bs", 0),
    ("speculative_ddtree_budget", -5), ("chunked_prefill_size", -2)])
def test_every_engine_number_is_range_bounded(key: str, value: Any) -> None:
    assert f"engine.{key}" in errors_of(spec(**{f"engine__{key}": value}))


def test_gpu_ids_are_bounded_and_listed_once() -> None:
    assert "0 to" in errors_of(spec(gpus=[99999]))["gpus"]
    assert "0 to" in errors_of(spec(gpus=[2**64]))["gpus"]
    assert "at most" in errors_of(spec(gpus=list(range(5000))))["gpus"]
    assert "twice" in errors_of(spec(gpus=[0, 0]))["gpus"]


def test_lists_and_items_are_bounded() -> None:
    assert "at most" in errors_of(spec(extra_args=["--x"] * 1000))["extra_args"]
    assert "the limit" in errors_of(spec(extra_args=["--x", "y" * 1_000_000]))["extra_args[1]"]
    assert "at most" in errors_of(spec(env={f"V{i}": "1" for i in range(500)}))["env"]
    assert "the limit" in errors_of(spec(env={"BIG": "x" * 1_000_000}))["env.BIG"]
    assert "at most" in errors_of(spec(secrets=[f"S{i}" for i in range(100)]))["secrets"]


def test_argv_and_env_together_stay_under_the_kernels_limit() -> None:
    many = {f"V{i}": "x" * 15_000 for i in range(12)}
    assert "add up to" in errors_of(spec(env=many))["spec"]


@pytest.mark.parametrize("key", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV",
                                 "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PATH", "PERL5OPT",
                                 "NODE_OPTIONS", "GLIBC_TUNABLES", "APPLIANCE_GPU_CHECK",
                                 "ld_preload"])
def test_loader_and_shell_variables_are_refused_by_name(key: str) -> None:
    message = errors_of(spec(env={key: "/tmp/x"}))[f"env.{key}"]
    assert key in message and "remove" in message


def test_a_secret_name_cannot_be_a_loader_variable_or_clash_with_env() -> None:
    assert "LD_PRELOAD" in errors_of(spec(secrets=["LD_PRELOAD"]))["secrets"]
    assert "also set under env" in errors_of(spec(secrets=["A_B"], env={"A_B": "1"}))["secrets"]


@pytest.mark.parametrize("char", ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85"])
def test_control_characters_are_refused_in_every_string(char: str) -> None:
    assert "engine.model_path" in errors_of(spec(engine__model_path=f"/models/a{char}b"))
    assert "extra_args[1]" in errors_of(spec(extra_args=["--schedule-policy", f"l{char}pm"]))
    assert "env.NCCL_DEBUG" in errors_of(spec(env={"NCCL_DEBUG": f"IN{char}FO"}))
    assert "recipe" in errors_of(spec(recipe=f"kimi{char}"))


@pytest.mark.parametrize("dressed", [f" {TOKEN}", f"{TOKEN} ", f"Bearer {TOKEN}",
                                     "bearer abcdefghijkl", f'"{TOKEN}"', f"x={TOKEN}",
                                     f"\u00a0{TOKEN}"])
def test_a_secret_shaped_value_is_refused_however_it_is_dressed(dressed: str) -> None:
    assert "secret" in errors_of(spec(env={"MY_VAR": dressed}))["env.MY_VAR"]
    findings = run_preflight(spec_from_dict(spec(extra_args=["--x", dressed])),
                             read_local_configs=False)
    assert [f.field for f in findings if f.rule == "secret-in-args"] == ["extra_args[1]"]


def test_a_path_that_merely_contains_sk_is_not_a_secret() -> None:
    assert not bounds.looks_like_secret("/models/sk-llama-3-8b-instruct-finetuned")


# ---------------------------------------------------------------- extra_args, typed

def test_option_flags_in_extra_args_become_the_typed_options() -> None:
    parsed = spec_from_dict(spec(extra_args=["--enable-dp-attention", "--dp-size", "8",
                                             "--mem-fraction-static=0.8", "--schedule-policy",
                                             "lpm"]))
    assert parsed.engine.enable_dp_attention and parsed.engine.dp_size == 8
    assert parsed.engine.mem_fraction_static == 0.8
    assert parsed.extra_args == ["--schedule-policy", "lpm"]
    argv = launch_args(parsed).argv
    assert argv.count("--dp-size") == 1 and "--enable-dp-attention" in argv


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "2", "-0.5", "lots"])
def test_an_option_in_extra_args_meets_the_options_range_check(value: str) -> None:
    message = errors_of(spec(extra_args=["--mem-fraction-static", value]))["extra_args[0]"]
    assert "--mem-fraction-static" in message


def test_the_dflash_dp_attention_rule_sees_flags_given_in_extra_args() -> None:
    parsed = spec_from_dict(spec(extra_args=["--enable-dp-attention", "--dp-size", "8"]))
    findings = run_preflight(parsed, recipe=load_recipe(parsed.recipe), read_local_configs=False)
    assert [f.severity for f in findings if f.rule == "dflash-dp-attention"] == ["error"]


def test_a_flag_given_as_an_option_and_in_extra_args_names_both() -> None:
    message = errors_of(spec(extra_args=["--tp-size", "4"]))["extra_args[0]"]
    assert "--tp-size" in message and "engine.tp_size" in message


def test_an_option_flag_without_its_value_or_with_a_bad_one_is_refused() -> None:
    assert "needs a value" in errors_of(spec(extra_args=["--dp-size"]))["extra_args[0]"]
    assert "integer" in errors_of(spec(extra_args=["--dp-size", "8x"]))["extra_args[0]"]
    assert "no value" in errors_of(spec(extra_args=["--enable-dp-attention=1"]))["extra_args[0]"]
    assert "twice" in errors_of(spec(extra_args=["--dp-size", "2", "--dp-size", "2"]))[
        "extra_args[2]"]


def test_a_recipe_default_is_overridden_by_an_extra_args_flag() -> None:
    parsed = spec_from_dict(spec(extra_args=["--page-size", "64"]),
                            engine_defaults={"page_size": 32})
    assert parsed.engine.page_size == 64


def test_a_stored_spec_reads_back_the_same() -> None:
    from appliance.engine.spec import spec_to_dict

    first = spec_from_dict(spec(extra_args=["--dp-size", "2", "--schedule-policy", "lpm"]))
    assert spec_from_dict(spec_to_dict(first)) == first


@pytest.mark.parametrize("size", ["64m", "32g", "32G", "2t", "512m"])
def test_a_sized_dev_shm_is_accepted(size: str) -> None:
    assert spec_from_dict(spec(shm_size=size)).shm_size == size.lower()


@pytest.mark.parametrize("size", ["1m", "3t", "32", "32gb", "0g", "-1g", " 32g", "32g\n",
                                  "9" * 4000 + "g", 32, None.__class__.__name__])
def test_a_dev_shm_out_of_bounds_or_malformed_is_refused(size: object) -> None:
    message = errors_of(spec(shm_size=size))["shm_size"]
    assert "64m to 2t" in message


def test_without_shm_size_the_appliances_default_applies() -> None:
    assert spec_from_dict(spec()).shm_size is None
