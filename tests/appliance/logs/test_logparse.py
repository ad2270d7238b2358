"""Tests for appliance.logs.parser against SGLang's real output formats.

Where each format comes from (sglang wheels 0.4.6.post5, 0.5.11, 0.5.23):
- prefix `[%(asctime)s{.%(msecs)03d}{prefix}] `: srt/utils/common.py configure_logger
  (SGLANG_LOG_MS adds msecs); ranks ` DPn PPn ATTN_CPn MOE_DPn TPn EPn`:
  srt/managers/scheduler.py (configure_scheduler_logger / run_scheduler_process).
- `Load weight begin/end`: srt/model_executor/model_runner.py ModelRunner.load_model
  (0.4.6: `type=.., dtype=..`; 0.5.x: `elapsed=.. s, type=.., [quant=.., ]`).
- shard bar: srt/utils/common.py BAR_FORMAT, srt/model_loader/weight_utils.py
  safetensors_weights_iterator (`Loading safetensors checkpoint shards`).
- `KV Cache is allocated`: srt/mem_cache/memory_pool.py (MHA `K size`/`V size`,
  MLA `KV size`; 0.5.23 adds `dtype: ..` and a label such as `Draft KV Cache`).
- old `Capture cuda graph begin/end`: 0.4.6/0.5.11 model_runner.init_device_graphs;
  `Capture cuda graph bs [..]`: 0.5.11 cuda_graph_runner.CudaGraphRunner.capture.
- new `Capture {role} {mode} CUDA graph begin/end` with backend, num_tokens_per_req,
  bs=[..]: 0.5.23 model_runner_components/cuda_graph_setup.py capture_decode_graph.
- `Capturing batches ({bs=} {avail_mem=:.2f} GB)`: cuda_graph_runner capture (tqdm, TP0).
- `The server is fired up and ready to roll!`: srt/entrypoints/http_server.py.
- `Decode batch` / `Prefill batch`: 0.4.6 managers/scheduler.py (`Decode batch. `),
  0.5.11 observability/scheduler_metrics_mixin.py, 0.5.23
  managers/scheduler_components/metrics_reporter.py report_decode_stats/report_prefill_stats.
- `Scheduler hit an exception: {traceback}`: srt/managers/scheduler.py.
- DDTree 101cd5bd0 (../shared/sglang-src): the old-style `Capture cuda graph begin/end` for
  target and draft (model_executor/model_runner.py init_device_graphs), and PyTorch's CUDA
  error block (`torch.AcceleratorError: CUDA error: ...` and its advice lines) after
  IndexKernel.cu's device-side assertion lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.logs.parser import LogEvent, LogParser, parse_lines, split_prefix

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def events_of(name: str, include_all: bool = False) -> list[LogEvent]:
    with open(LOGS / name, encoding="utf-8") as handle:
        return list(parse_lines(handle, include_all=include_all))


def kinds(events: list[LogEvent], kind: str) -> list[LogEvent]:
    return [event for event in events if event.kind == kind]


def test_an_event_dict_has_line_kind_and_its_fields_flat() -> None:
    event = LogEvent(3, "kv_cache", {"tokens": 5})
    assert event.to_dict() == {"line": 3, "kind": "kv_cache", "tokens": 5}


def test_it_reads_ranks_and_millisecond_timestamps_from_the_prefix() -> None:
    message, ranks = split_prefix("[2026-05-03 11:00:10.442 DP1 PP0 TP3 EP3] Load weight begin.")
    assert message == "Load weight begin."
    assert ranks == {"dp": 1, "pp": 0, "tp": 3, "ep": 3}


def test_it_leaves_a_line_without_prefix_untouched() -> None:
    assert split_prefix("Capturing batches (bs=4") == ("Capturing batches (bs=4", {})


def test_it_follows_a_dflash_deployment_from_load_to_ready_on_0_5_23() -> None:
    events = events_of("dflash_ready_0523.log")
    order = [e.kind for e in events if e.kind != "decode_stats" and e.kind != "prefill_stats"]
    first = {kind: order.index(kind) for kind in set(order)}
    assert (
        first["weights_begin"]
        < first["weights_progress"]
        < first["weights_end"]
        < first["kv_cache"]
        < first["capture_begin"]
        < first["capture_progress"]
        < first["capture_end"]
        < first["ready"]
    )
    assert "error" not in first and "diagnosis" not in first


def test_it_reports_weight_load_time_and_memory_with_the_rank() -> None:
    end = kinds(events_of("dflash_ready_0523.log"), "weights_end")[0]
    assert end.fields["elapsed_s"] == 380.57
    assert end.fields["mem_usage_gb"] == 74.34
    assert end.fields["model_type"] == "DeepseekV3ForCausalLM"
    assert end.fields["tp"] == 0


def test_it_reads_the_legacy_weight_line_without_elapsed_time() -> None:
    end = kinds(events_of("legacy_046.log"), "weights_end")[0]
    assert end.fields["elapsed_s"] is None
    assert end.fields["mem_usage_gb"] == 15.30


def test_it_reads_mla_and_mha_kv_cache_sizes() -> None:
    mla = kinds(events_of("baseline_0511.log"), "kv_cache")[0]
    mha = kinds(events_of("legacy_046.log"), "kv_cache")[0]
    assert (mla.fields["tokens"], mla.fields["kv_size_gb"]) == (1034112, 35.12)
    assert (mha.fields["k_size_gb"], mha.fields["v_size_gb"]) == (24.41, 24.41)


def test_it_tells_the_draft_kv_pool_from_the_target_pool() -> None:
    pools = kinds(events_of("dflash_ready_0523.log"), "kv_cache")
    assert {event.fields["draft"] for event in pools} == {True, False}


def test_it_reads_role_mode_and_width_of_a_new_style_capture() -> None:
    begins = kinds(events_of("ddtree_verify_width.log"), "capture_begin")
    widths = {(e.fields["role"], e.fields["mode"], e.fields["num_tokens_per_req"]) for e in begins}
    assert widths == {("target", "verify", 8), ("draft", "verify", 33)}


def test_it_reads_the_captured_batch_sizes_from_a_new_style_capture_end() -> None:
    end = kinds(events_of("dflash_ready_0523.log"), "capture_end")[0]
    assert end.fields["bs"] == [1, 2, 4, 8, 16, 24, 32, 40, 48]
    assert end.fields["elapsed_s"] == 21.21


def test_an_old_style_capture_has_no_role_width_or_batch_list() -> None:
    events = events_of("baseline_0511.log")
    begin = kinds(events, "capture_begin")[0]
    end = kinds(events, "capture_end")[0]
    assert begin.fields["num_tokens_per_req"] is None and begin.fields["role"] is None
    assert end.fields["bs"] is None and end.fields["elapsed_s"] == 10.12


def test_the_last_tqdm_update_of_a_line_wins() -> None:
    parser = LogParser()
    line = (
        "  0%|          | 0/3 [00:00<?, ?it/s]\r"
        "Capturing batches (bs=4 avail_mem=20.11 GB):   0%|          | 0/3 [00:00<?, ?it/s]\r"
        "Capturing batches (bs=4 avail_mem=20.11 GB):  33%|###   | 1/3 [00:01<00:02,  1.2s/it]\r"
        "Capturing batches (bs=2 avail_mem=20.06 GB):  67%|#### | 2/3 [00:02<00:01,  1.2s/it]"
    )
    events = parser.feed(line)
    assert [e.to_dict() for e in events] == [
        {"line": 1, "kind": "capture_progress", "bs": 2, "done": 2, "total": 3,
         "avail_mem_gb": 20.06}
    ]


def test_it_counts_weight_shards_from_the_progress_bar() -> None:
    progress = kinds(events_of("dflash_ready_0523.log"), "weights_progress")
    assert progress[-1].fields == {"done": 64, "total": 64}


def test_decode_stats_carry_speculative_fields_and_the_graph_flag() -> None:
    decode = kinds(events_of("dflash_ready_0523.log"), "decode_stats")[0]
    assert decode.to_dict() == {
        "line": decode.line, "kind": "decode_stats", "running_req": 1, "tokens": 1532,
        "token_usage": 0.01, "accept_len": 4.87, "accept_rate": 0.70, "cuda_graph": True,
        "gen_throughput": 303.12, "queue_req": 0, "tp": 0,
    }


def test_decode_stats_without_speculation_have_null_acceptance() -> None:
    decode = kinds(events_of("baseline_0511.log"), "decode_stats")[0]
    assert decode.fields["accept_len"] is None and decode.fields["accept_rate"] is None
    assert decode.fields["gen_throughput"] == 106.1


def test_it_reads_the_legacy_dotted_decode_and_prefill_lines() -> None:
    events = events_of("legacy_046.log")
    decode = kinds(events, "decode_stats")[0]
    prefill = kinds(events, "prefill_stats")[0]
    assert (decode.fields["running_req"], decode.fields["accept_len"]) == (1, 3.12)
    assert (prefill.fields["new_token"], prefill.fields["cuda_graph"]) == (7, None)


def test_prefill_stats_report_new_and_cached_tokens() -> None:
    prefill = kinds(events_of("dflash_ready_0523.log"), "prefill_stats")[2]
    assert prefill.fields["new_token"] == 512
    assert prefill.fields["cached_token"] == 128
    assert prefill.fields["input_throughput"] == 4121.5


def test_a_decode_line_with_a_forward_iteration_is_parsed() -> None:
    # SGLANG_LOG_FORWARD_ITERS adds " [iter]" after "Decode batch".
    (event,) = LogParser().feed(
        "[2026-05-03 11:08:10 TP0] Decode batch [4711], #running-req: 2, #token: 90, "
        "token usage: 0.00, cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 1"
    )
    assert (event.fields["running_req"], event.fields["queue_req"]) == (2, 1)


def test_a_traceback_becomes_one_error_with_its_lines() -> None:
    errors = kinds(events_of("ddtree_verify_width.log"), "error")
    assert len(errors) == 2  # TP0 and TP3 both crash
    first = errors[0]
    assert first.fields["message"].startswith("RuntimeError: The size of tensor a (8)")
    assert first.fields["tp"] == 0
    assert first.fields["traceback"][0].endswith("Traceback (most recent call last):")
    assert any("cuda_graph_runner.py" in line for line in first.fields["traceback"])


def test_the_error_is_emitted_only_when_the_traceback_ends() -> None:
    parser = LogParser()
    assert parser.feed("Traceback (most recent call last):") == []
    assert parser.feed('  File "x.py", line 1, in f') == []
    assert parser.feed("ValueError: boom") == []
    flushed = parser.finish()
    assert [e.kind for e in flushed] == ["error"]
    assert flushed[0].fields["message"] == "ValueError: boom"
    assert flushed[0].line == 1


def test_a_chained_exception_reports_the_last_exception_and_its_notes() -> None:
    error = kinds(events_of("cuda_oom_capture.log"), "error")[0]
    assert error.fields["message"].startswith("Exception: Capture cuda graph failed")
    assert "During handling of the above exception, another exception occurred:" in (
        error.fields["traceback"]
    )
    assert error.fields["traceback"][-1].startswith("Open an issue on GitHub")


def test_torch_rank_prefixes_are_stripped_from_traceback_lines() -> None:
    error = kinds(events_of("nccl_timeout.log"), "error")[0]
    assert error.fields["rank"] == 4
    assert error.fields["message"].startswith("torch.distributed.DistBackendError")


def test_a_log_record_interleaved_in_a_traceback_is_still_parsed() -> None:
    parser = LogParser()
    parser.feed("Traceback (most recent call last):")
    interleaved = parser.feed("[2026-05-02 09:07:09 TP1] Load weight begin. avail mem=1.00 GB")
    parser.feed('  File "x.py", line 1, in f')
    parser.feed("KeyError: 'x'")
    assert [e.kind for e in interleaved] == ["weights_begin"]
    assert [e.fields["message"] for e in parser.finish()] == ["KeyError: 'x'"]


def test_a_cuda_error_keeps_its_advice_lines_and_the_kernel_asserts_are_no_errors() -> None:
    errors = kinds(events_of("ddtree_tree_mask_assert.log"), "error")
    assert [e.fields["tp"] for e in errors] == [0, 1]
    assert errors[0].fields["message"] == \
        "torch.AcceleratorError: CUDA error: device-side assert triggered"
    assert "For debugging consider passing CUDA_LAUNCH_BLOCKING=1" in errors[0].fields["traceback"]


def test_the_pr_sources_target_and_draft_captures_are_old_style_captures() -> None:
    events = events_of("ddtree_draft_fa3_capture.log")
    assert len(kinds(events, "capture_begin")) == 16  # target then draft, 8 ranks each
    assert len(kinds(events, "capture_end")) == 8  # the draft never finishes
    (error, _) = kinds(events, "error")
    assert error.fields["message"] == \
        "AttributeError: 'NoneType' object has no attribute 'page_table'"


def test_it_emits_a_diagnosis_after_the_error_it_explains() -> None:
    events = events_of("ddtree_verify_width.log")
    index = next(i for i, e in enumerate(events) if e.kind == "error")
    diagnosis = events[index + 1]
    assert diagnosis.kind == "diagnosis"
    assert diagnosis.fields["cause"] == "ddtree-verify-width"
    assert diagnosis.fields["fatal"] is True


def test_it_flags_speculative_decoding_without_cuda_graphs_once() -> None:
    found = kinds(events_of("silent_eager_verify.log"), "diagnosis")
    assert [e.fields["cause"] for e in found] == ["silent-eager-verify"]


def test_a_healthy_baseline_has_no_diagnosis() -> None:
    assert kinds(events_of("baseline_0511.log"), "diagnosis") == []


def test_include_all_reports_unmatched_lines_with_their_text() -> None:
    events = events_of("port_in_use.log", include_all=True)
    lines = kinds(events, "line")
    assert lines[0].fields["text"].endswith("Started server process [1]")
    assert [e.line for e in events if e.kind != "diagnosis"] == list(range(1, 7))


def test_without_include_all_unmatched_lines_are_dropped() -> None:
    assert kinds(events_of("dflash_ready_0523.log"), "line") == []


@pytest.mark.parametrize("path", sorted(LOGS.glob("*.log")), ids=lambda p: p.name)
def test_every_event_line_number_points_into_its_file(path: Path) -> None:
    total = len(path.read_text(encoding="utf-8").splitlines())
    events = events_of(path.name)
    assert events
    assert all(1 <= event.line <= total for event in events)


# 433c58ed7's capture lines (model_executor/model_runner_components/cuda_graph_setup.py:311-315),
# target first, then the draft (managers/scheduler.py:839-843), on every TP rank.
DDTREE_V2_CAPTURE = [
    "[2026-11-30 02:10:01 TP0] Capture target verify CUDA graph begin. backend=full, "
    "num_tokens_per_req={target}, bs=[1, 2, 4, 8, 16, 24, 32, 40, 48], avail mem=31.20 GB",
    "[2026-11-30 02:10:41 TP0] Capture target verify CUDA graph end. elapsed=40.12 s, "
    "mem usage=3.05 GB, avail mem=28.15 GB.",
    "[2026-11-30 02:10:42 TP0] Capture draft verify CUDA graph begin. backend=full, "
    "num_tokens_per_req={draft}, bs=[1, 2, 4, 8, 16, 24, 32, 40, 48], avail mem=28.10 GB",
]


def _captures(target: int, draft: int, needed: dict[str, int] | None) -> list:
    parser = LogParser(needed_widths=needed)
    events = []
    for line in DDTREE_V2_CAPTURE:
        events += parser.feed(line.format(target=target, draft=draft))
    return events


def test_a_capture_line_carries_the_width_the_spec_needs_for_that_role() -> None:
    events = _captures(33, 8, {"target": 33, "draft": 8})
    begins = [e.fields for e in events if e.kind == "capture_begin"]
    assert [(b["role"], b["num_tokens_per_req"], b["needed_tokens_per_req"]) for b in begins] \
        == [("target", 33, 33), ("draft", 8, 8)]
    assert begins[0]["mode"] == "verify"
    assert not [e for e in events if e.kind == "diagnosis"]


def test_a_width_that_disagrees_is_a_finding_at_capture_time() -> None:
    """The PR head's bug: the target verify graph captured at the block size. The finding
    comes with the capture line, minutes before the first request would crash."""
    events = _captures(8, 8, {"target": 33, "draft": 8})
    (found,) = [e.fields for e in events if e.kind == "diagnosis"]
    assert found["cause"] == "graph-width-mismatch" and found["fatal"] is False
    assert found["evidence"] == {"role": "target", "captured_width": 8, "needed_width": 33}
    assert events.index(next(e for e in events if e.kind == "diagnosis")) == 1, \
        "right after the target's capture line"


def test_without_a_spec_the_parser_only_reports_what_it_saw() -> None:
    events = _captures(8, 8, None)
    assert not [e for e in events if e.kind == "diagnosis"]
    assert "needed_tokens_per_req" not in events[0].fields


def test_the_batch_sizes_on_a_v2_begin_line_are_the_captured_ones() -> None:
    parser = LogParser()
    parser.feed(DDTREE_V2_CAPTURE[0].format(target=33))
    assert parser.context.capture_bs == [1, 2, 4, 8, 16, 24, 32, 40, 48]
    assert parser.context.verify_width == 33


def _recorded_decode_messages() -> list[str]:
    root = Path(__file__).resolve().parents[2] / "fixtures"
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in ("", ".log", ".txt"):
            for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
                message, _ = split_prefix(raw.partition(" ")[2] if raw[:4].isdigit() else raw)
                if message.startswith("Decode batch"):
                    found.append(message)
    return found


def test_the_fast_decode_path_agrees_with_the_general_parse_on_every_recorded_line():  # type: ignore[no-untyped-def]
    from appliance.logs.lines import decode_stats, decode_stats_fast

    messages = _recorded_decode_messages()
    assert len(messages) > 200
    fast = 0
    for message in messages:
        quick = decode_stats_fast(message)
        if quick is not None:
            fast += 1
            assert quick == decode_stats(message), message
    assert fast >= 0.9 * len(messages)  # the recorded engines' lines take the fast path


@pytest.mark.parametrize("message", [
    "Decode batch. #running-req: 1, #token: 9, token usage: 0.00, accept len: 1.50, "
    "cuda graph: True, gen throughput (token/s): 3.00, #queue-req: 0",  # 0.4.x
    "Decode batch [12], #running-req: 1, #token: 9, token usage: 0.00, cuda graph: True, "
    "gen throughput (token/s): 3.00, #queue-req: 0",  # with an iteration
    "Decode batch, #running-req: 1, #token: 9, token usage: 0.00, cuda graph: True, "
    "gen throughput (token/s): 12, #queue-req: 0",  # a value of another shape
    "Decode batch, #running-req: 1, #full token: 9, full token usage: 0.01, cuda graph: "
    "True, gen throughput (token/s): 3.00, #queue-req: 0, ",  # another pool's keys
])
def test_a_decode_line_of_another_shape_takes_the_general_parse(message):  # type: ignore[no-untyped-def]
    from appliance.logs.lines import classify, decode_stats, decode_stats_fast

    assert decode_stats_fast(message) is None
    kind, fields = classify(message) or ("", {})
    assert (kind, fields) == ("decode_stats", decode_stats(message))
    assert fields["running_req"] == 1 and fields["tokens"] == 9
