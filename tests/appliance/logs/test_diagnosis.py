"""Tests for appliance.logs.diagnosis on realistic failure logs (tests/fixtures/logs).

Where each failure message comes from:
- tensor-size mismatch: torch's broadcast check raised by `Tensor.copy_` in
  sglang/srt/model_executor/cuda_graph_runner.py CudaGraphRunner.replay
  (`self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)`, 0.5.11).
- CUDA OOM: torch.OutOfMemoryError text (c10 CUDACachingAllocator); SGLang wraps a capture
  failure as `Capture cuda graph failed: {e}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}`
  (cuda_graph_runner.py 0.5.11, runner_backend_utils/__init__.py 0.5.23).
- NCCL: torch.distributed.DistBackendError from ProcessGroupNCCL, NCCL's shmutils.cc
  `Error while creating shared memory segment`, the c10d watchdog timeout message.
- model path: huggingface_hub HFValidationError, transformers configuration_utils OSError.
- trust_remote_code: transformers dynamic_module_utils.resolve_trust_remote_code.
- port: uvicorn's bind error `[Errno 98] ... address already in use`.
- driver: torch/cuda/__init__.py _lazy_init (`driver on your system is too old`).
- DFlash + DP attention: 0.5.11 server_args.py `Currently DFLASH speculative decoding does
  not support dp attention.`; 0.5.23 arg_groups/speculative_hook.py `DFLASH with dp
  attention requires --enable-dp-lm-head.`
- FlashInfer MLA: srt/layers/attention/flashinfer_mla_backend.py `Currently Flashinfer MLA
  only supports topk=1 for speculative decoding`.
- tokenizer: transformers tokenization_utils_base `Can't load tokenizer for ...`.
- silent eager verify: 0.5.23 decode_cuda_graph_runner.can_run falls back to eager when
  `spec_info.num_tokens_per_req != self.captured_req_width`; metrics_reporter prints
  `cuda graph: False`.
- DDTree (101cd5bd0 from ../shared/sglang-src, file paths and lines of the fixtures are that
  source's with ddtree-verify-graph-width applied, unpatched for ddtree_fa3_unpatched_capture):
  the draft capture's `AttributeError: 'NoneType' object has no attribute 'page_table'`
  (flashattention_backend.py forward_extend), unpatched fa3's `'FlashAttentionBackend' object
  has no attribute 'target_verify_metadata_topk_normal'`, the verify input ids' `size of
  tensor a (66) ... b (2)` from torch._foreach_copy_ in cuda_graph_buffer_registry.py, and
  the tree mask's `where expected condition to be a boolean tensor, but got a tensor with dtype
  BFloat16`, `torch.AcceleratorError: CUDA error: device-side assert triggered` (PyTorch's
  text, after IndexKernel.cu's assertion lines) and triton's `expand(...)` rank error. Python
  and PyTorch messages checked against torch 2.13 on CPU; appliance.logs.ddtree_causes says
  where in each source they are raised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.logs.catalogue import CATALOGUE
from appliance.logs.causes import CAUSES, Diagnosis
from appliance.logs.context import ParseContext
from appliance.logs.diagnosis import diagnose
from appliance.logs.matchers import match_error, match_line

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
MISMATCH = "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) at \
non-singleton dimension 0"
REPLAY = [
    "Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 1303, in replay',
    "    self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)",
]


def diagnose_file(name: str) -> Diagnosis | None:
    with open(LOGS / name, encoding="utf-8") as handle:
        return diagnose(handle)


def replay_error(a: int, b: int, ctx: ParseContext | None = None) -> Diagnosis | None:
    message = MISMATCH.format(a=a, b=b)
    return match_error(message, [*REPLAY, message], ctx)


@pytest.mark.parametrize(
    ("fixture", "cause"),
    [
        ("ddtree_verify_width.log", "ddtree-verify-width"),
        ("cuda_oom_capture.log", "cuda-oom-capture"),
        ("cuda_oom_load.log", "cuda-oom-load"),
        ("nccl_shm.log", "shm-too-small"),
        ("nccl_timeout.log", "nccl-failure"),
        ("model_not_found.log", "model-not-found"),
        ("trust_remote_code.log", "trust-remote-code"),
        ("port_in_use.log", "port-in-use"),
        ("driver_too_old.log", "driver-too-old"),
        ("silent_eager_verify.log", "silent-eager-verify"),
        ("dflash_dp_attention.log", "dflash-dp-attention"),
        ("flashinfer_mla_tree.log", "flashinfer-mla-tree"),
        ("tokenizer_missing.log", "tokenizer-missing"),
        ("ddtree_draft_fa3_capture.log", "ddtree-draft-flash-attention"),
        ("ddtree_fa3_unpatched_capture.log", "ddtree-fa3-verify-metadata"),
        ("ddtree_verify_input_ids.log", "ddtree-verify-input-ids"),
        ("ddtree_tree_mask_where.log", "ddtree-tree-mask-format"),
        ("ddtree_tree_mask_assert.log", "ddtree-tree-mask-format"),
    ],
)
def test_it_names_the_cause_of_each_catalogued_failure(fixture: str, cause: str) -> None:
    found = diagnose_file(fixture)
    assert found is not None
    assert found.cause == cause
    assert found.summary and found.fix
    assert found.cause in CAUSES


@pytest.mark.parametrize(
    "fixture", ["baseline_0511.log", "dflash_ready_0523.log", "legacy_046.log"]
)
def test_a_healthy_log_has_no_diagnosis(fixture: str) -> None:
    assert diagnose_file(fixture) is None


def test_every_cause_has_an_id_summary_and_fix() -> None:
    for cause_id, cause in CATALOGUE.items():
        assert cause.id == cause_id
        assert cause.summary.strip() and cause.fix.strip()


def test_the_ddtree_diagnosis_relates_the_sizes_to_block_size_and_budget() -> None:
    found = diagnose_file("ddtree_verify_width.log")
    assert found is not None
    assert "captured for 8 tokens per request (block size)" in found.summary
    assert "DDTree verify feeds 33 (budget 32 + 1)" in found.summary
    assert "ddtree-verify-graph-width" in found.fix and "disable_cuda_graph" in found.fix
    assert (found.evidence["size_a"], found.evidence["size_b"]) == (8, 33)


def test_it_derives_per_request_widths_from_the_captured_width_at_batch_two() -> None:
    found = replay_error(16, 66, ParseContext(verify_width=8))
    assert found is not None
    assert (found.evidence["captured_width"], found.evidence["fed_width"]) == (8, 33)
    assert found.evidence["bs"] == 2
    assert "budget 32 + 1" in found.summary


def test_it_derives_per_request_widths_from_the_batch_size_being_captured() -> None:
    found = replay_error(24, 99, ParseContext(last_bs=3))
    assert found is not None
    assert (found.evidence["captured_width"], found.evidence["fed_width"]) == (8, 33)


def test_without_a_known_batch_size_it_reports_the_raw_sizes() -> None:
    found = replay_error(16, 66)
    assert found is not None
    assert found.evidence["bs"] is None
    assert (found.evidence["captured_width"], found.evidence["fed_width"]) == (16, 66)


def test_a_draft_graph_captured_at_the_tree_width_is_explained_the_other_way_round() -> None:
    found = replay_error(33, 8)
    assert found is not None
    assert found.cause == "ddtree-verify-width"
    assert "draft graph was captured for 33" in found.summary
    assert "feeds 8 (block size)" in found.summary


def test_a_size_mismatch_outside_graph_replay_is_not_blamed_on_ddtree() -> None:
    message = MISMATCH.format(a=8, b=33)
    found = match_error(message, ["Traceback (most recent call last):", "  File 'model.py'",
                                  message])
    assert found is None


def test_an_oom_during_capture_names_the_batch_size_being_captured() -> None:
    found = diagnose_file("cuda_oom_capture.log")
    assert found is not None
    assert found.evidence["bs"] == 64
    assert "cuda_graph_max_bs" in found.fix and "mem_fraction_static" in found.fix


def test_an_oom_while_serving_is_a_runtime_oom() -> None:
    message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    found = match_error(message, [message], ParseContext(phase="serving"))
    assert found is not None and found.cause == "cuda-oom-runtime"


def test_the_driver_diagnosis_reports_the_cuda_version_the_driver_supports() -> None:
    found = diagnose_file("driver_too_old.log")
    assert found is not None
    assert found.evidence["driver_cuda"] == "12.8"
    assert "580" in found.fix


def test_the_container_runtime_driver_check_is_recognised_on_one_line() -> None:
    found = match_line(
        "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please "
        "update your driver to a newer version, or use an earlier cuda container: unknown"
    )
    assert found is not None
    assert (found.cause, found.evidence["required_cuda"]) == ("driver-too-old", "13.0")


def test_the_newer_dflash_dp_attention_message_is_recognised() -> None:
    message = "ValueError: DFLASH with dp attention requires --enable-dp-lm-head."
    found = match_error(message, [message])
    assert found is not None and found.cause == "dflash-dp-attention"


def test_a_fatal_cause_wins_over_an_earlier_warning() -> None:
    lines = [
        "a1b2c3:125:460 [2] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer",
        "[2026-04-21 10:06:25 TP2] Capture cuda graph begin. This can take up to several "
        "minutes. avail mem=3.11 GB",
        "[2026-04-21 10:06:29 TP2] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "cuda_graph_runner.py", line 880, in capture',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.",
    ]
    found = diagnose(lines)
    assert found is not None and found.cause == "cuda-oom-capture"


def test_a_specific_root_cause_beats_the_nccl_errors_it_causes_on_other_ranks() -> None:
    lines = [
        "[2026-04-21 10:06:28 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "parallel_state.py", line 1511, in all_reduce',
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote "
        "process exited or there was a network error",
        "[2026-04-21 10:06:29 TP2] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "model_runner.py", line 1346, in load_model',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.",
    ]
    found = diagnose(lines)
    assert found is not None and found.cause == "cuda-oom-load"


def test_an_unknown_error_is_reported_with_its_message() -> None:
    found = diagnose(["Traceback (most recent call last):", '  File "x.py", line 1, in f',
                      "KeyError: 'rope_scaling'"])
    assert found is not None
    assert found.cause == "unknown-error"
    assert "KeyError: 'rope_scaling'" in found.summary


def test_eager_decode_above_the_largest_captured_batch_is_not_a_fault() -> None:
    lines = [
        "[2026-05-04 12:06:58 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4], "
        "elapsed=12.87 s, mem usage=1.10 GB, avail mem=19.01 GB.",
        "[2026-05-04 12:08:00 TP0] Decode batch, #running-req: 9, #token: 1200, token usage: "
        "0.00, accept len: 6.01, accept rate: 0.74, cuda graph: False, gen throughput "
        "(token/s): 141.00, #queue-req: 0",
    ]
    assert diagnose(lines) is None


def test_a_diagnosis_dict_has_cause_summary_fix_and_evidence() -> None:
    found = diagnose_file("port_in_use.log")
    assert found is not None
    assert set(found.to_dict()) == {"cause", "summary", "fix", "evidence"}


# ---- DDTree sources (appliance.logs.ddtree_causes)

SG = "/opt/sglang/python/sglang/srt"
VERIFY = [
    "Traceback (most recent call last):",
    f'  File "{SG}/speculative/ddtree_worker.py", line 314, in forward_batch_generation',
    "    batch_result = self.target_worker.forward_batch_generation(",
    f'  File "{SG}/model_executor/cuda_graph_runner.py", line 1180, in replay',
    "    self.replay_prepare(forward_batch, pp_proxy_tensors)",
]


def verify_error(frames: list[str], message: str) -> Diagnosis | None:
    return match_error(message, [*VERIFY, *frames, message])


def test_the_draft_capture_crash_names_the_draft_backend_as_the_fix() -> None:
    found = diagnose_file("ddtree_draft_fa3_capture.log")
    assert found is not None
    assert found.evidence["path"] == "draft graph capture" and found.evidence["phase"] == "capture"
    assert "--speculative-draft-attention-backend flashinfer" in found.fix
    assert found.patch == {"engine.speculative_draft_attention_backend": "flashinfer"}


def test_the_eager_draft_crash_on_the_missing_custom_mask_is_the_same_cause() -> None:
    message = "TypeError: 'NoneType' object is not subscriptable"
    frames = [f'  File "{SG}/layers/attention/flashattention_backend.py", line 595, in '
              "init_forward_metadata", "    mask = forward_batch.spec_info.custom_mask["]
    found = match_error(message, ["Traceback (most recent call last):", *frames, message])
    assert found is not None and found.cause == "ddtree-draft-flash-attention"
    assert found.evidence["path"] == "eager draft forward"


def test_a_none_page_table_outside_flash_attention_is_not_blamed_on_the_draft() -> None:
    message = "AttributeError: 'NoneType' object has no attribute 'page_table'"
    frames = ['  File "/opt/sglang/python/sglang/srt/layers/attention/triton_backend.py", line 9']
    assert match_error(message, ["Traceback (most recent call last):", *frames, message]) is None


def test_unpatched_fa3_capture_points_at_the_width_patch() -> None:
    found = diagnose_file("ddtree_fa3_unpatched_capture.log")
    assert found is not None and "ddtree-verify-graph-width" in found.fix


def test_verify_input_ids_never_set_read_one_token_per_request() -> None:
    found = diagnose_file("ddtree_verify_input_ids.log")
    assert found is not None
    assert (found.evidence["captured_width"], found.evidence["fed_width"]) == (33, 1)
    assert found.evidence["bs"] == 2 and "at bs=1" in found.summary


def test_the_target_width_mismatch_through_the_buffer_registry_stays_a_width_fault() -> None:
    found = verify_error([], MISMATCH.format(a=16, b=66))
    assert found is not None and found.cause == "ddtree-verify-width"
    assert (found.evidence["size_a"], found.evidence["size_b"]) == (16, 66)


def test_the_tree_mask_diagnosis_names_what_each_backend_did() -> None:
    where = diagnose_file("ddtree_tree_mask_where.log")
    assert where is not None and "torch.where refuses a bfloat16 condition" in where.summary
    asserted = diagnose_file("ddtree_tree_mask_assert.log")
    assert asserted is not None and "device-side assert" in asserted.summary
    assert "398fc2c72 or 433c58ed7" in asserted.fix


def test_the_triton_mask_copy_error_is_the_tree_mask_format() -> None:
    message = ("RuntimeError: expand(CUDABFloat16Type{[2, 33, 1090]}, size=[2]): the "
               "number of sizes provided (1) must be greater or equal to the number of "
               "dimensions in the tensor (3)")
    frames = [f'  File "{SG}/layers/attention/triton_backend.py", line 420, in '
              "_update_target_verify_buffers",
              "    custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask"]
    found = verify_error(frames, message)
    assert found is not None and found.cause == "ddtree-tree-mask-format"
    assert found.evidence["backend"] == "triton_backend" and "triton" in found.summary


def test_a_device_side_assert_elsewhere_is_a_generic_kernel_assert() -> None:
    message = "torch.AcceleratorError: CUDA error: device-side assert triggered"
    lines = ["Traceback (most recent call last):",
             f'  File "{SG}/layers/sampler.py", line 120, in forward',
             "    batch_next_token_ids = torch.multinomial(probs, num_samples=1)", message,
             "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
             "group__CUDART__TYPES.html for more information."]
    found = match_error(message, lines)
    assert found is not None and found.cause == "cuda-device-assert"
    assert "CUDA_LAUNCH_BLOCKING=1" in found.fix


def test_ddtree_v2_names_the_backend_that_cannot_verify_a_tree() -> None:
    message = ("RuntimeError: DDTREE full-tree verify does not support target backend "
               "sglang.srt.layers.attention.flashinfer_mla_backend.FlashInferMLAAttnBackend: "
               "DDTree full-tree target verify needs either packed-mask support or FA "
               "visibility metadata support.")
    found = match_error(message, [message])
    assert found is not None and found.cause == "ddtree-target-backend"
    assert found.evidence["backend"].endswith("FlashInferMLAAttnBackend")
    assert "triton" in found.fix
