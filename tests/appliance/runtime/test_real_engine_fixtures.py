"""The real engine's recordings are whole, replayable, and say what their README says.

Every run folder in tests/fixtures/real-engine/ (made by tests/gpu/real-engine.sh) carries its
run.json, a Docker-stamped engine.log and its /metrics series; the test engine can replay each;
the second round's refusals and INT4 runs hold the facts the gateway and the catalogue build on.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from appliance.runtime.logstream import parse_docker_ts
from tests import real_engine as rec

ROOT = Path(__file__).resolve().parents[3]
RIG = ROOT / "tests" / "gpu" / "realengine"
PHASES = {"starting", "idle", "load", "idle-after", "stopping"}
SPECULATIVE_REFUSALS = ("refusals_ddtree", "refusals_dflash", "ddtree_int4", "dflash_int4")
BASELINE_REFUSALS = ("refusals_base", "base_int4")
GRAMMAR = "speculative decoding does not support grammar-constrained decoding yet."
LOGPROBS = "speculative decoding does not support return_logprob yet."


def refusals(run: str) -> dict[str, dict[str, Any]]:
    return {answer["name"]: answer for answer in rec.json_file(run, "refusals.json")}


def message(answer: dict[str, Any]) -> str:
    return str(answer["body"]["message"])


@pytest.mark.parametrize(("commit", "run"), rec.all_runs())
def test_every_recording_has_its_argv_a_docker_stamped_log_and_its_metrics(commit: str, run: str) -> None:
    info = rec.run_info(run, commit)
    assert info["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert all(isinstance(item, str) for item in info["argv"]) and "returncode" in info
    with open(rec.folder(run, commit) / "engine.log", encoding="utf-8", newline="\n") as log:
        stamps = [parse_docker_ts(row.partition(" ")[0]) for row in log]
    assert stamps and stamps == sorted(stamps)
    with gzip.open(rec.folder(run, commit) / "metrics.jsonl.gz", "rt", encoding="utf-8") as rows:
        snaps = [json.loads(row) for row in rows]
    assert snaps and {snap["phase"] for snap in snaps} <= PHASES
    assert all(isinstance(snap["status"], int) and parse_docker_ts(snap["t"]) for snap in snaps)


def test_the_test_engine_can_replay_every_recording() -> None:
    # The test engine's own loader, in its own process (its `sglang` is a stand-in package).
    script = ("import json, sys; from pathlib import Path; from sglang.test_engine.replay import load\n"
              "print(json.dumps({p: len(load(Path(p)).lines) for p in sys.argv[1:]}))")
    folders = [str(rec.folder(run, commit)) for commit, run in rec.all_runs()]
    done = subprocess.run([sys.executable, "-c", script, *folders], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "docker" / "test-engine")},
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(count > 0 for count in json.loads(done.stdout).values())


@pytest.mark.parametrize("run", SPECULATIVE_REFUSALS + BASELINE_REFUSALS)
def test_each_refusals_file_answers_every_request_the_rig_sends_and_the_engine_stays_up(run: str) -> None:
    sys.path.insert(0, str(RIG))
    try:
        from record import refusal_requests
    finally:
        sys.path.remove(str(RIG))
    answers = rec.json_file(run, "refusals.json")
    assert [a["name"] for a in answers] == [name for name, *_ in refusal_requests("m", 262144)]
    assert all(isinstance(a["status"], int) and a["health_after"] == 200 for a in answers)
    assert refusals(run)["long_fits"]["sent"]["prompt"].startswith("'a' x 262044")


@pytest.mark.parametrize("run", SPECULATIVE_REFUSALS)
def test_a_speculative_engine_refuses_grammar_tools_required_and_logprobs_with_a_400(run: str) -> None:
    answers = refusals(run)
    for name in ("json_schema", "json_object", "tool_required"):
        assert answers[name]["status"] == 400 and message(answers[name]) == f"DFLASH {GRAMMAR}"
    for name in ("logprobs_chat", "logprobs_completion"):
        assert answers[name]["status"] == 400 and message(answers[name]) == f"DFLASH {LOGPROBS}"


@pytest.mark.parametrize("run", SPECULATIVE_REFUSALS)
def test_a_speculative_engine_streams_its_grammar_refusal_as_an_error_event_after_a_200(run: str) -> None:
    stream = refusals(run)["json_schema_stream"]
    assert stream["status"] == 200 and stream["content_type"].startswith("text/event-stream")
    first = json.loads(stream["body"].split("\n\n")[0].removeprefix("data: "))
    assert first["error"]["code"] == 400 and first["error"]["message"] == f"DFLASH {GRAMMAR}"


@pytest.mark.parametrize("run", SPECULATIVE_REFUSALS)
def test_a_streamed_logprobs_request_to_a_speculative_engine_is_a_500_not_a_refusal(run: str) -> None:
    answer = refusals(run)["logprobs_chat_stream"]
    assert answer["status"] == 500
    assert message(answer) == "Internal server error: 'output_token_logprobs_length'"


@pytest.mark.parametrize("run", SPECULATIVE_REFUSALS + BASELINE_REFUSALS)
def test_every_mode_serves_tool_auto_n2_and_the_long_prompt_and_refuses_past_the_context(run: str) -> None:
    answers = refusals(run)
    assert answers["tool_auto"]["status"] == 200
    assert answers["n2"]["status"] == 200 and len(answers["n2"]["body"]["choices"]) == 2
    assert answers["long_fits"]["status"] == 200
    assert answers["long_fits"]["body"]["usage"]["prompt_tokens"] == 262044
    assert answers["long_over"]["status"] == 400
    assert message(answers["long_over"]).startswith(
        "Requested token count exceeds the model's maximum context length of 262144 tokens.")


@pytest.mark.parametrize("run", BASELINE_REFUSALS)
def test_the_baseline_serves_what_the_speculative_modes_refuse(run: str) -> None:
    answers = refusals(run)
    for name in ("json_schema", "json_object", "tool_required", "logprobs_chat", "logprobs_completion"):
        assert answers[name]["status"] == 200
    assert answers["logprobs_completion"]["body"]["choices"][0]["logprobs"]
    assert answers["json_schema_stream"]["body"].startswith("data: {\"id\"")


@pytest.mark.parametrize(("run", "widths"), [
    ("ddtree_int4", [("target", "verify", 33), ("draft", "verify", 8)]),
    ("dflash_int4", [("target", "verify", 8), ("draft", "verify", 8)]),
    ("dflash_int4_alone", [("target", "verify", 8), ("draft", "verify", 8)]),
    ("base_int4", [("target", "decode", 1)]),
    ("base_int4_alone", [("target", "decode", 1)]),
])
def test_the_int4_target_loads_as_compressed_tensors_and_captures_at_its_widths(
        run: str, widths: list[tuple[str, str, int]]) -> None:
    assert any("type=DeepseekV3ForCausalLM, quant=compressed-tensors" in line.text
               for line in rec.lines(run))
    assert [(b["role"], b["mode"], b["num_tokens_per_req"])
            for b in rec.of_kind(run, "capture_begin")] == widths
    assert rec.run_info(run)["ready_s"] is not None


def test_the_first_int4_start_on_a_fresh_host_spends_minutes_in_its_target_capture() -> None:
    # The Marlin MoE kernels are JIT-built inside the first capture, which prints nothing
    # meanwhile; with them cached (base_int4_alone, the same machine) it takes seconds.
    first = rec.of_kind("dflash_int4_alone", "capture_end")[0]["elapsed_s"]
    cached = rec.of_kind("base_int4_alone", "capture_end")[0]["elapsed_s"]
    assert first > 300 and cached < 10
