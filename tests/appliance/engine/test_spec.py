"""The deployment spec: validation that reports every field error, and mechanical launch args."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from appliance.engine.launch import launch_args
from appliance.engine.schema import json_schema
from appliance.engine.spec import (
    DeploymentSpec,
    EngineOptions,
    SpecError,
    load_spec,
    spec_from_dict,
    spec_to_dict,
)
from tests.specs import spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def flagship() -> dict[str, Any]:
    """The shared DDTree spec on all 8 GPUs."""
    return spec(gpus=list(range(8)), engine__tp_size=8, engine__disable_cuda_graph=False)


def errors_of(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    return {e.field: e.message for e in info.value.errors}


def test_it_accepts_the_flagship_spec_from_the_issue() -> None:
    spec = spec_from_dict(flagship())
    assert spec.engine.speculative_ddtree_budget == 32
    assert spec.gpus == list(range(8))


def test_it_suggests_the_closest_name_for_an_unknown_engine_key() -> None:
    data = flagship()
    data["engine"]["speculative_ddtree_bugdet"] = 32
    errors = errors_of(data)
    assert "did you mean 'speculative_ddtree_budget'" in errors["engine.speculative_ddtree_bugdet"]


def test_it_suggests_the_closest_name_for_an_unknown_top_level_key() -> None:
    data = flagship()
    data["gpu"] = data.pop("gpus")
    errors = errors_of(data)
    assert "did you mean 'gpus'" in errors["gpu"]


def test_it_reports_all_field_errors_at_once() -> None:
    data = flagship()
    data["engine"]["tp_size"] = "eight"
    data["engine"]["trust_remote_code"] = "yes"
    data["gpus"] = [0, 1, 1]
    data["extra_args"] = ["--log-level", 3]
    errors = errors_of(data)
    assert {"engine.tp_size", "engine.trust_remote_code", "gpus", "extra_args"} <= set(errors)


def test_it_rejects_a_bool_where_an_integer_is_needed() -> None:
    data = flagship()
    data["engine"]["tp_size"] = True
    assert "engine.tp_size" in errors_of(data)


def test_it_rejects_duplicate_gpu_ids() -> None:
    data = flagship()
    data["gpus"] = [0, 1, 2, 2]
    assert "[2]" in errors_of(data)["gpus"]


def test_it_requires_a_model_path() -> None:
    data = flagship()
    del data["engine"]["model_path"]
    assert "engine.model_path" in errors_of(data)


def test_it_rejects_an_unknown_speculative_algorithm_with_a_suggestion() -> None:
    data = flagship()
    data["engine"]["speculative_algorithm"] = "DTREE"
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    (error,) = info.value.errors
    assert "DDTREE" in error.fix


def test_it_upper_cases_the_speculative_algorithm() -> None:
    data = flagship()
    data["engine"]["speculative_algorithm"] = "dflash"
    assert spec_from_dict(data).engine.speculative_algorithm == "DFLASH"


def test_it_rejects_an_env_key_that_looks_like_a_secret() -> None:
    data = flagship()
    data["env"] = {"HF_TOKEN": "whatever"}
    assert "secret" in errors_of(data)["env.HF_TOKEN"]


def test_it_rejects_an_env_value_shaped_like_a_token() -> None:
    data = flagship()
    data["env"] = {"MY_VAR": "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"}
    assert "env.MY_VAR" in errors_of(data)


def test_it_keeps_plain_env_and_secret_names() -> None:
    data = flagship()
    data["env"] = {"NCCL_DEBUG": "WARN"}
    data["secrets"] = ["HF_TOKEN"]
    spec = spec_from_dict(data)
    plan = launch_args(spec)
    assert plan.env["NCCL_DEBUG"] == "WARN"
    assert plan.secrets == ["HF_TOKEN"]
    assert "HF_TOKEN" not in plan.env


def test_it_rejects_a_name_that_cannot_name_a_container() -> None:
    data = flagship()
    data["name"] = "Kimi DDTree!"
    assert "name" in errors_of(data)


def test_it_maps_fields_to_flags_mechanically() -> None:
    argv = launch_args(spec_from_dict(flagship())).argv
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "32"
    assert "--trust-remote-code" in argv


def test_it_omits_false_bools_and_defaults_equal_to_sglang() -> None:
    data = flagship()
    data["engine"]["tp_size"] = 1
    data["gpus"] = [0]
    argv = launch_args(spec_from_dict(data)).argv
    assert "--disable-cuda-graph" not in argv
    assert "--tp-size" not in argv
    assert "--dp-size" not in argv


def test_it_always_sets_host_port_and_metrics() -> None:
    data = {"name": "plain", "recipe": "kimi-k2.6-baseline", "gpus": [0],
            "engine": {"model_path": "/m"}}
    argv = launch_args(spec_from_dict(data)).argv
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "30000"
    assert "--enable-metrics" in argv
    assert "--speculative-algorithm" not in argv


def test_it_appends_extra_args_after_the_engine_flags() -> None:
    data = flagship()
    data["extra_args"] = ["--schedule-policy", "lpm"]
    assert launch_args(spec_from_dict(data)).argv[-2:] == ["--schedule-policy", "lpm"]


def test_it_allows_a_longer_context_for_the_dflash_family_only() -> None:
    plan = launch_args(spec_from_dict(flagship()))
    assert plan.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
    data = flagship()
    data["engine"] = {"model_path": "/m", "tp_size": 8}
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in launch_args(spec_from_dict(data)).env


def test_it_lays_recipe_defaults_under_the_spec() -> None:
    data = flagship()
    del data["engine"]["attention_backend"]
    spec = spec_from_dict(data, engine_defaults={"attention_backend": "triton", "tp_size": 4})
    assert spec.engine.attention_backend == "triton"
    assert spec.engine.tp_size == 8


def test_it_round_trips_through_a_dict() -> None:
    spec = spec_from_dict(flagship())
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_it_loads_the_shipped_examples() -> None:
    for name in ("kimi-ddtree.yaml", "kimi-dflash.yaml"):
        spec = load_spec(EXAMPLES / name)
        assert isinstance(spec, DeploymentSpec)
        assert spec.engine.tp_size == 8


def test_it_reports_bad_yaml_as_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError):
        load_spec(path)


def test_its_json_schema_lists_every_engine_field_with_its_flag() -> None:
    props = json_schema()["properties"]["engine"]["properties"]
    assert set(props) == set(EngineOptions.__dataclass_fields__)
    assert props["speculative_ddtree_budget"]["x-flag"] == "--speculative-ddtree-budget"
    assert "DDTREE" in props["speculative_algorithm"]["enum"]


def test_it_reads_replicas_a_host_and_a_companion() -> None:
    parsed = spec_from_dict({**flagship(), "replicas": 3, "host": "gpu-host-1",
                             "companion": "kimi-base"})
    assert (parsed.replicas, parsed.host, parsed.companion) == (3, "gpu-host-1", "kimi-base")
    assert spec_to_dict(parsed)["replicas"] == 3


def test_a_spec_without_them_is_one_replica_placed_by_the_panel_with_no_companion() -> None:
    parsed = spec_from_dict(flagship())
    assert (parsed.replicas, parsed.host, parsed.companion) == (1, None, None)


@pytest.mark.parametrize("value", [0, -1, 129, True, "3", 2.5])
def test_it_rejects_a_replica_count_that_is_not_1_to_128(value: Any) -> None:
    assert "from 1 to 128" in errors_of({**flagship(), "replicas": value})["replicas"]


def test_it_rejects_a_host_that_is_not_a_name_and_a_companion_that_is_itself() -> None:
    data = flagship()
    errors = errors_of({**data, "host": "Host 1!", "companion": data["name"]})
    assert "lowercase DNS label" in errors["host"]
    assert "itself" in errors["companion"]
