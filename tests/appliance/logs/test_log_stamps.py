"""Docker's time prefix (`docker logs -t`): the command line reads a log with it or without
it alike, and the agent splits it with the same reader (appliance.logs.stamps).

The recordings' engine.log files are in `-t` format, as the rig and an operator get them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.logs.parser import parse_lines
from appliance.logs.stamps import parse_docker_ts, split_docker_stamp, without_docker_stamps
from appliance.runtime.logstream import lines_of
from tests import real_engine as rec

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def _raw(run: str) -> list[str]:
    with open(rec.folder(run) / "engine.log", encoding="utf-8", newline="\n") as log:
        return list(log)


def _bare(run: str) -> list[str]:
    return [split_docker_stamp(line)[1] for line in _raw(run)]


def test_a_stamp_with_nanoseconds_is_split_from_its_line() -> None:
    line = "2026-12-01T10:00:00.123456789Z [2026-12-01 10:00:00 TP0] Load weight begin."
    assert split_docker_stamp(line) == ("2026-12-01T10:00:00.123456789Z",
                                        "[2026-12-01 10:00:00 TP0] Load weight begin.")
    assert parse_docker_ts("2026-12-01T10:00:00.123456789Z") % 10**9 == 123456789


@pytest.mark.parametrize("line", [
    "[2026-12-01 10:00:00] The server is fired up and ready to roll!",
    "2026-12-01 10:00:00 a date, but not Docker's stamp",
    "12345 tokens",
    "2026-12-01T10:00:00.1234Z",  # a stamp with no line after it is not split
    "",
])
def test_a_line_without_dockers_stamp_is_left_whole(line: str) -> None:
    assert split_docker_stamp(line) == (None, line)


def test_a_stamp_with_an_offset_means_the_same_instant() -> None:
    assert split_docker_stamp("2026-12-01T12:00:00.5+02:00 x")[1] == "x"
    assert parse_docker_ts("2026-12-01T12:00:00.5+02:00") == parse_docker_ts(
        "2026-12-01T10:00:00.5Z")


@pytest.mark.parametrize(("commit", "run"), rec.all_runs())
def test_every_recording_reads_the_same_with_and_without_the_stamps(commit: str,
                                                                    run: str) -> None:
    raw = rec.folder(run, commit) / "engine.log"
    with open(raw, encoding="utf-8", newline="\n") as log:
        stamped = list(log)
    assert all(split_docker_stamp(line)[0] for line in stamped if line.strip())
    bare = [split_docker_stamp(line)[1] for line in stamped]
    with_stamps = [e.to_dict() for e in parse_lines(without_docker_stamps(stamped))]
    without = [e.to_dict() for e in parse_lines(without_docker_stamps(bare))]
    assert with_stamps == without
    assert not any("Z [" in json.dumps(e) or "Z Traceback" in json.dumps(e)
                   for e in with_stamps)


def test_the_cli_finds_capture_kv_and_ready_in_the_rigs_raw_log() -> None:
    result = _cli("parse-log", str(rec.folder("ddtree_triton") / "engine.log"))
    assert result.returncode == 0, result.stderr
    kinds = {json.loads(line)["kind"] for line in result.stdout.splitlines()}
    assert {"capture_begin", "capture_end", "kv_cache", "ready", "decode_stats"} <= kinds
    bare = _cli("parse-log", "-", stdin="".join(_bare("ddtree_triton")))
    assert bare.stdout == result.stdout


def test_the_diagnosis_of_a_raw_log_quotes_the_traceback_without_the_stamp(
        tmp_path: Path) -> None:
    # A crash the catalogue does not know, as `docker logs -t` gives it, on rank 1.
    log = tmp_path / "engine.log"
    log.write_text(
        "2026-12-01T10:00:00.100000000Z [2026-12-01 10:00:00 TP1] Scheduler hit an exception: "
        "Traceback (most recent call last):\n"
        '2026-12-01T10:00:00.100000100Z   File "/sgl/scheduler.py", line 1, in run\n'
        "2026-12-01T10:00:00.100000200Z     run()\n"
        "2026-12-01T10:00:00.100000300Z KeyError: 'no_such_key'\n")
    found = json.loads(_cli("diagnose", str(log)).stdout)["diagnosis"]
    assert found["cause"] == "unknown-error"
    assert found["evidence"]["message"] == "KeyError: 'no_such_key'"
    assert found["summary"].endswith(": KeyError: 'no_such_key'")
    events = [json.loads(line) for line in _cli("parse-log", str(log)).stdout.splitlines()]
    (error,) = [e for e in events if e["kind"] == "error"]
    assert error["tp"] == 1 and error["traceback"][1].startswith('  File "/sgl/scheduler.py"')


def test_per_rank_prefixes_after_the_stamp_keep_their_ranks() -> None:
    # The recordings ran at TP1 (no rank in the prefix): the same lines as TP0 and TP1 print.
    ranked = []
    for line in _raw("ddtree_triton"):
        stamp, rest = split_docker_stamp(line)
        if rest.startswith("[2026-") and "] Load weight begin" in rest:
            close = rest.index("] ")
            for rank in (0, 1):
                ranked.append(f"{stamp} {rest[:close]} TP{rank}{rest[close:]}")
    begun = [e for e in parse_lines(without_docker_stamps(ranked)) if e.kind == "weights_begin"]
    assert sorted(e.fields["tp"] for e in begun) == [0, 0, 1, 1]
    assert [e.fields["model"] for e in begun if e.fields["tp"] == 1] == ["target", "draft"]


def test_the_agent_splits_stamps_with_the_same_reader() -> None:
    raw = _raw("dflash_triton")
    data = "".join(raw).encode()
    frames = [(1, data[i:i + 4096]) for i in range(0, len(data), 4096)]
    agent = list(lines_of(frames, timestamps=True))
    assert [line.text for line in agent] == [split_docker_stamp(r.rstrip("\n"))[1] for r in raw]
    assert [line.ts_ns for line in agent] == [
        parse_docker_ts(split_docker_stamp(r)[0] or "") for r in raw]


_DIGIT = st.sampled_from("0123456789")


@st.composite
def _stamped(draw: st.DrawFn) -> str:
    """A line as Docker stamps it, or nearly: any digits (a month 13, an hour 25), 0 to 10
    fraction digits, `Z` or an offset, a space or not, a stamp-like start of the text."""
    def digits(n: int) -> str:
        return "".join(draw(st.lists(_DIGIT, min_size=n, max_size=n)))
    stamp = f"{digits(4)}-{digits(2)}-{digits(2)}T{digits(2)}:{digits(2)}:{digits(2)}"
    frac = digits(draw(st.integers(0, 10)))
    stamp += f".{frac}" if frac or draw(st.booleans()) else ""
    stamp += draw(st.sampled_from(["Z", "Z", "+02:00", "-05:30", ""]))
    # (No NUL, which the reader replaces, no newline, which ends a line, no lone surrogate.)
    rest = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00\n"),
                   max_size=20)
    return stamp + draw(st.sampled_from([" ", " ", ""])) + draw(rest)


@given(st.lists(_stamped(), min_size=1, max_size=20))
def test_the_agents_reading_of_a_stamp_is_the_general_one(lines: list[str]) -> None:
    # The agent reads Docker's own form with one match a line; any other line takes the
    # general reading. Both must give the same line and time for every input.
    frames = [(1, (line + "\n").encode()) for line in lines]
    agent = [(line.text, line.ts_ns) for line in lines_of(frames, timestamps=True)]
    expected = []
    for text in lines:
        stamp, rest = split_docker_stamp(text)
        try:
            expected.append((rest, parse_docker_ts(stamp)) if stamp else (text, None))
        except ValueError:
            expected.append((text, None))
    assert agent == expected
