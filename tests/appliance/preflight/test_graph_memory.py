"""Pre-flight's CUDA-graph memory estimate, held against the real engine's captures."""

from __future__ import annotations

import pytest

from appliance.engine.spec import spec_from_dict
from appliance.preflight import run_preflight
from appliance.preflight.graph_memory import CALIBRATED_ERROR, target_graph_gib
from tests import real_engine as rec

# run -> (largest captured batch size, width, context) as the recording's own lines say.
CAPTURED = {
    "ddtree_triton": (48, 33, 262144),
    "ddtree_triton_bs16": (16, 33, 262144),
    "ddtree_triton_ctx32k": (48, 33, 32768),
    "dflash_triton": (48, 8, 262144),
    "dflash_triton_bs16": (16, 8, 262144),
    "base_triton": (256, 1, 262144),
}


def _captured(run: str) -> tuple[int, int, float]:
    begin, end = rec.of_kind(run, "capture_begin")[0], rec.of_kind(run, "capture_end")[0]
    assert begin["role"] == "target"
    return max(begin["bs"]), begin["num_tokens_per_req"], end["mem_usage_gb"]


@pytest.mark.parametrize("run", sorted(CAPTURED))
def test_the_estimate_is_within_its_stated_error_of_each_real_capture(run: str) -> None:
    max_bs, width, context = CAPTURED[run]
    assert _captured(run)[:2] == (max_bs, width)
    real = _captured(run)[2]
    estimate = target_graph_gib(max_bs=max_bs, width=width, context_len=context)
    error = (estimate - real) / real
    print(f"{run}: real {real:.2f} GB, estimate {estimate:.2f} GB, error {error:+.1%}")
    assert abs(error) <= CALIBRATED_ERROR


def _server_args(run: str) -> str:
    return next(line.text for line in rec.lines(run) if "server_args=ServerArgs(" in line.text)


@pytest.mark.parametrize("run", sorted(CAPTURED))
def test_the_context_each_run_used_is_the_one_estimated(run: str) -> None:
    # No context_length: the model's max_position_embeddings (262,144) is the context.
    wanted = "context_length=32768" if CAPTURED[run][2] == 32768 else "context_length=None"
    assert wanted in _server_args(run)


def _spec(**engine: object) -> object:
    return spec_from_dict({"name": "t", "recipe": "kimi-k2.6-ddtree", "gpus": [0],
                           "engine": {"model_path": "/models/none", "speculative_algorithm": "DDTREE",
                                      "speculative_draft_model_path": "/models/none-d",
                                      "speculative_num_draft_tokens": 8,
                                      "speculative_ddtree_budget": 32, **engine}})


def _graph_findings(spec: object, **kw: object) -> list:
    found = run_preflight(spec, model_config={"max_position_embeddings": 262144},  # type: ignore[arg-type]
                          read_local_configs=False, **kw)  # type: ignore[arg-type]
    return [f for f in found if f.rule == "graph-memory"]


def test_preflight_states_the_width_33_graphs_memory_for_triton() -> None:
    (finding,) = _graph_findings(_spec(attention_backend="triton"))
    assert finding.severity == "info"
    assert "about 10.2 GB" in finding.message and "within 8%" in finding.message


def test_the_recorded_capture_oom_is_foreseen() -> None:
    # capture_oom ran mem_fraction_static 0.97 on a 139.8 GB H200 and ran out of memory.
    (finding,) = _graph_findings(_spec(attention_backend="triton", mem_fraction_static=0.97),
                                 gpu_memory_gb=139.8)
    assert finding.severity == "warning" and "cuda_graph_max_bs (to 24)" in finding.fix


def test_fa3_is_not_estimated_from_triton_captures() -> None:
    assert _graph_findings(_spec(attention_backend="fa3")) == []
