"""The log parser and the diagnosis held against the real engine's own output.

The recordings (tests/fixtures/real-engine) are the reference: where the parser's source
reading (SGLang 0.5.23) and 433c58ed7's real lines disagree, the recording wins, and each
such case is named below.
"""

from __future__ import annotations

import re

import pytest

from tests import real_engine as rec

# Each line the panel must read, by the text that makes it that line, and the event it is.
MUST_READ = (
    (re.compile(r"\] Load weight begin"), "weights_begin"),
    (re.compile(r"\] Load weight end"), "weights_end"),
    (re.compile(r"loading shards: .*Completed"), "weights_progress"),
    (re.compile(r"\] KV Cache is allocated"), "kv_cache"),
    (re.compile(r"\] Capture (target|draft) \w+ CUDA graph begin|Capture cuda graph begin"),
     "capture_begin"),
    (re.compile(r"\] Capture (target|draft) \w+ CUDA graph end"), "capture_end"),
    (re.compile(r"Capturing batches \(bs=\d+ avail_mem"), "capture_progress"),
    (re.compile(r"\] Decode batch, "), "decode_stats"),
    (re.compile(r"\] Prefill batch, "), "prefill_stats"),
    (re.compile(r"The server is fired up and ready to roll!"), "ready"),
)
RUNS = rec.all_runs()


def _kinds_at(run: str, commit: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for index, event in rec.events(run, commit):
        found.setdefault(index, set()).add(event.kind)
    return found


@pytest.mark.parametrize(("commit", "run"), RUNS)
def test_every_line_the_panel_must_read_becomes_its_event(commit: str, run: str) -> None:
    kinds = _kinds_at(run, commit)
    wrong = [(i, kind, sorted(kinds.get(i, ())), line.text[:160])
             for i, line in enumerate(rec.lines(run, commit))
             for pattern, kind in MUST_READ
             if pattern.search(line.text) and kind not in kinds.get(i, set())]
    assert wrong == []


@pytest.mark.parametrize(("commit", "run"), RUNS)
def test_no_line_of_a_recording_is_dropped(commit: str, run: str) -> None:
    # Every line yields an event (a known kind, or a plain line the log view shows as is);
    # a traceback's lines are the one event that carries them all, and the blank line SGLang
    # prints after a traceback carries nothing.
    covered = set(_kinds_at(run, commit))
    in_traceback = {i for _, event in rec.events(run, commit) if event.kind == "error"
                    for i in range(event.line - 1, event.line - 1 + len(event.fields["traceback"]))}
    dropped = [(i, line.text[:120]) for i, line in enumerate(rec.lines(run, commit))
               if i not in covered and i not in in_traceback and line.text.strip()]
    assert dropped == []


def test_433c58ed7s_shard_progress_line_is_read() -> None:
    # 0.5.23 prints "Loading safetensors checkpoint shards"; 433c58ed7 prints "Multi-thread
    # loading shards: 100% Completed | 1/1": the recording wins.
    assert rec.of_kind("ddtree_triton", "weights_progress")[-1] == {"done": 1, "total": 1}


def test_the_second_kv_cache_line_is_the_drafters() -> None:
    target, draft = rec.of_kind("ddtree_triton", "kv_cache")
    assert (target["model"], target["draft"], target["kv_size_gb"]) == ("target", False, 75.55)
    assert (draft["model"], draft["draft"]) == ("draft", True)
    assert (draft["k_size_gb"], draft["v_size_gb"], draft["tokens"]) == (22.39, 22.39, 23473287)


def test_a_run_without_a_drafter_has_only_the_targets_kv_cache() -> None:
    assert [kv["model"] for kv in rec.of_kind("base_triton", "kv_cache")] == ["target"]


def test_weight_loads_are_told_apart_by_model() -> None:
    loads = rec.of_kind("ddtree_triton", "weights_end")
    assert [(w["model"], w["model_type"], w["elapsed_s"]) for w in loads] == [
        ("target", "DeepseekV3ForCausalLM", 0.26), ("draft", "DFlashDraftModel", 0.02)]


CAPTURES = {
    # run: [(role, mode, width, elapsed_s, mem_usage_gb, batch sizes)], as printed
    "ddtree_triton": [("target", "verify", 33, 32.68, 10.0, 23), ("draft", "verify", 8, 30.62, 0.79, 23)],
    "ddtree_fa3": [("target", "verify", 33, 30.9, 2.39, 23), ("draft", "verify", 8, 29.96, 0.24, 23)],
    "dflash_triton": [("target", "verify", 8, 6.47, 2.45, 23), ("draft", "verify", 8, 3.1, 0.79, 23)],
    # DFLASH on the engine's default backend (fa3 on Hopper): width 8 takes 0.45 GB, not 2.45.
    "dflash_fa3": [("target", "verify", 8, 28.67, 0.45, 23), ("draft", "verify", 8, 27.31, 0.24, 23)],
    "verify_dflash_fa3": [("target", "verify", 8, 4.25, 0.45, 23), ("draft", "verify", 8, 29.74, 0.24, 23)],
    # Warm (Triton's cache kept from an earlier run of the call), beside a second engine.
    "verify_ddtree_base": [("target", "verify", 33, 4.92, 10.0, 23), ("draft", "verify", 8, 2.69, 0.79, 23)],
    "verify_ddtree_fa3": [("target", "verify", 33, 15.06, 2.39, 23), ("draft", "verify", 8, 26.19, 0.24, 23)],
    "base_triton": [("target", "decode", 1, 8.48, 1.67, 36)],
    "ddtree_triton_bs16": [("target", "verify", 33, 1.85, 3.47, 12), ("draft", "verify", 8, 0.98, 0.29, 12)],
    "ddtree_triton_ctx32k": [("target", "verify", 33, 2.49, 6.96, 23), ("draft", "verify", 8, 0.96, 0.13, 23)],
}


@pytest.mark.parametrize("run", sorted(CAPTURES))
def test_capture_widths_durations_and_memory_per_role(run: str) -> None:
    begins, ends = rec.of_kind(run, "capture_begin"), rec.of_kind(run, "capture_end")
    got = [(b["role"], b["mode"], b["num_tokens_per_req"], e["elapsed_s"], e["mem_usage_gb"], len(b["bs"]))
           for b, e in zip(begins, ends, strict=True)]
    assert got == CAPTURES[run]


@pytest.mark.parametrize("run", ["ddtree_triton", "dflash_triton", "base_triton"])
def test_a_captures_printed_time_matches_the_time_between_its_lines(run: str) -> None:
    stamps = {kind: [rec.lines(run)[i].ts_ns for i, e in rec.events(run) if e.kind == kind]
              for kind in ("capture_begin", "capture_end")}
    for begin, end, printed in zip(stamps["capture_begin"], stamps["capture_end"],
                                   [e["elapsed_s"] for e in rec.of_kind(run, "capture_end")], strict=True):
        assert abs((end - begin) / 1e9 - printed) < 1.0


@pytest.mark.parametrize("run", ["ddtree_triton", "dflash_triton", "base_triton", "ddtree_probe",
                                 "dflash_probe", "ddtree_fa3", "ddtree_triton_bs16", "ddtree_triton_ctx32k",
                                 "dflash_triton_bs16", "dflash_fa3", "verify_ddtree_base",
                                 "verify_dflash_fa3", "verify_ddtree_fa3", "bigload_triton"])
def test_ready_is_found_once_in_every_run_that_came_up(run: str) -> None:
    assert len(rec.of_kind(run, "ready")) == 1
    assert rec.run_info(run)["ready_s"] is not None


@pytest.mark.parametrize("run", rec.FAILURES)
def test_no_failed_run_is_ready(run: str) -> None:
    assert rec.of_kind(run, "ready") == []


def test_ddtree_decode_stats_carry_accept_length_and_cuda_graph() -> None:
    stats = rec.of_kind("ddtree_triton", "decode_stats")
    assert len(stats) == 24
    assert all(s["cuda_graph"] is True for s in stats)
    # The tiny random drafter gets little accepted: 1.00-1.30 tokens per verify.
    assert min(s["accept_len"] for s in stats) >= 1.0 and max(s["accept_len"] for s in stats) <= 1.3
    assert stats[0] == {"running_req": 1, "tokens": 160, "token_usage": 0.0, "accept_len": 1.3,
                             "accept_rate": 0.04, "cuda_graph": True, "gen_throughput": 2.73,
                             "queue_req": 0}


def test_prefill_lines_say_no_graph_and_that_is_not_a_finding() -> None:
    # MLA disables the prefill graph ("Breakable CUDA graph is incompatible with MLA"):
    # every Prefill batch line says cuda graph: False, by design.
    prefills = rec.of_kind("ddtree_triton", "prefill_stats")
    assert prefills and all(p["cuda_graph"] is False for p in prefills)


@pytest.mark.parametrize("run", ["ddtree_triton", "dflash_triton", "base_triton",
                                 "ddtree_probe", "dflash_probe", "ddtree_fa3", "dflash_fa3",
                                 "verify_ddtree_base", "verify_dflash_fa3", "verify_ddtree_fa3",
                                 "bigload_triton"])
def test_a_healthy_run_and_its_stop_give_no_diagnosis(run: str) -> None:
    # Its stop prints SGLang's real shutdown, one of two ways: "Subprocess scheduler_0 (pid=..)
    # crashed with exit code -15. Triggering SIGQUIT for cleanup..." after SIGTERM, or
    # (dflash_fa3) "SIGTERM received. ... Draining requests and shutting down..." and
    # "Gracefully exiting...": neither is a failure.
    assert any("crashed with exit code -15" in line.text or "SIGTERM received" in line.text
               for line in rec.lines(run))
    assert _failures(run) == []
    # What the engine warned of is a finding with a severity, never a failure's cause: the
    # speculative runs' cap of 48 concurrent requests (the rig sets none), nothing else.
    findings = {d["cause"] for d in rec.of_kind(run, "diagnosis") if d.get("severity")}
    assert findings <= {"max-running-requests-reset"}


def _failures(run: str, commit: str = rec.PINNED) -> list[dict[str, object]]:
    return [d for d in rec.of_kind(run, "diagnosis", commit) if not d.get("severity")]


DIAGNOSED = {
    (rec.PR_HEAD, "ddtree101_triton"): ("ddtree-capture-hidden-mode", None),
    (rec.PINNED, "missing_model"): ("model-not-found", None),
    (rec.PINNED, "kv_too_small"): ("kv-cache-no-memory", {"engine.mem_fraction_static": None}),
    (rec.PINNED, "drafter_hidden_mismatch"): ("drafter-target-mismatch", None),
    (rec.PINNED, "capture_oom"): ("cuda-oom-capture", {"engine.cuda_graph_max_bs": 16}),
    (rec.PINNED, "tree_backend_unsupported"): ("attention-backend-cannot-run-mla",
                                               {"engine.attention_backend": "fa3"}),
}


@pytest.mark.parametrize(("commit", "run"), sorted(DIAGNOSED))
def test_each_recorded_failure_is_named_with_a_cause_and_a_fix(commit: str, run: str) -> None:
    cause, patch = DIAGNOSED[(commit, run)]
    found = _failures(run, commit)
    assert [d["cause"] for d in found] == [cause]
    assert found[0]["fix"] and found[0]["summary"]
    assert found[0].get("patch") == patch


def test_101cd5bd0s_first_failure_is_its_capture_not_the_seeds_width_error() -> None:
    errors = rec.of_kind("ddtree101_triton", "error", rec.PR_HEAD)
    assert len(errors) == 1
    assert errors[0]["message"] == ("AttributeError: 'DDTreeVerifyInput' object has no attribute "
                                    "'capture_hidden_mode'")
    assert not any("must match the size of tensor b" in line.text
                   for line in rec.lines("ddtree101_triton", rec.PR_HEAD))


def test_the_drafter_mismatch_names_both_hidden_sizes() -> None:
    evidence = _failures("drafter_hidden_mismatch")[0]["evidence"]
    assert (evidence["drafter_hidden_size"], evidence["target_hidden_size"]) == (384, 256)


def test_the_kv_failure_reports_the_minimum_the_engine_named() -> None:
    evidence = _failures("kv_too_small")[0]["evidence"]
    assert evidence["min_mem_fraction_static"] == 0.003
