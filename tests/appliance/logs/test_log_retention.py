"""Which engine log lines the retention keeps for good (appliance.logs.retention)."""

from __future__ import annotations

from appliance.logs.retention import LineKeeper, is_stats_line

PREFIX = "[2026-12-01 09:00:00 TP0] "
DECODE = (PREFIX + "Decode batch, #running-req: 2, #token: 4096, token usage: 0.05, "
          "accept len: 3.21, accept rate: 0.40, cuda graph: True, gen throughput (token/s): "
          "120.50, #queue-req: 0")


def _kept(lines: list[str]) -> list[str]:
    keeper = LineKeeper()
    return [line for line in lines if keeper.keep(line)]


def test_it_keeps_a_whole_traceback_and_drops_the_chatter_around_it() -> None:
    traceback = [
        PREFIX + "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/scheduler.py", line 10, in event_loop',
        "    self.run_batch(batch)",
        "           ^^^^^^^^^^",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        '  File "/sgl/model_runner.py", line 99, in forward',
        "    return self.graph.replay()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "Possible solutions: lower --mem-fraction-static",
    ]
    chatter = [PREFIX + "Prefill batch done for request 42", PREFIX + "GET /health 200"]
    assert _kept(chatter[:1] + traceback + chatter[1:]) == traceback


def test_it_keeps_phase_capture_and_warning_lines_and_drops_stats_lines() -> None:
    lines = [
        PREFIX + "Load weight begin. avail mem=78.00 GB",
        PREFIX + "Capture cuda graph begin. This can take up to several minutes.",
        PREFIX + "KV Cache is allocated. #tokens: 100000, K size: 10.00 GB, V size: 10.00 GB",
        PREFIX + "WARNING: the draft model's vocabulary differs",
        PREFIX + "The server is fired up and ready to roll!",
        DECODE,
        PREFIX + "Prefill batch, #new-seq: 1, #new-token: 32, #cached-token: 0, token usage: 0.01",
        PREFIX + "Receive: obj=GenerateReqInput(...)",
        "plain output with no prefix",
    ]
    assert _kept(lines) == lines[:5]


def test_a_stats_line_that_reports_an_error_is_kept_and_is_no_stats_line() -> None:
    odd = DECODE + " (error: NaN in logits)"
    assert _kept([odd]) == [odd]
    assert is_stats_line(DECODE) and not is_stats_line(odd)
    assert not is_stats_line(PREFIX + "Load weight end. elapsed=4.00 s")


def test_a_traceback_ends_at_the_next_log_record() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "ValueError: bad value",
        PREFIX + "Receive: obj=GenerateReqInput(...)",
        "    indented output of the engine, after the record",
    ]
    assert _kept(lines) == lines[:3]
