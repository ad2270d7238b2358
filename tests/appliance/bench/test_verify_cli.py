"""`appliance verify` (run as a real subprocess) against two local servers that answer
/generate as SGLang 433c58ed7 did on the H200 (tests/fixtures/real-engine): A replays the DDTREE
probe's answers and refuses log-probs with the recorded 400, B replays the baseline's answers
with their top-2 log-probs."""

from __future__ import annotations

import asyncio
import atexit
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from appliance.bench.lossless import TOP_LOGPROBS, first_divergence
from appliance.bench.verify import BUILTIN_PROMPTS, SHIPPED_PROMPTS_FILE, shipped_prompts
from tests import real_engine as rec

ROOT = Path(__file__).resolve().parents[3]
BASE, CAND = rec.json_file("base_triton", "probe.json"), rec.json_file("ddtree_probe", "probe.json")


@dataclass
class Served:
    url: str
    seen: list[dict[str, Any]]  # the request bodies, in order


@contextmanager
def generate_server(answers: list[dict[str, Any]], *, logprobs: bool) -> Iterator[Served]:
    """/generate answering each recorded prompt with its recorded answer (the recordings'
    prompts are the built-in set); where `logprobs` is false a request for them gets the
    recorded refusal."""
    by_prompt = {a["prompt"]: a for a in answers}
    seen: list[dict[str, Any]] = []

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        answer = by_prompt.get(body.get("text"))
        if answer is None:
            return web.json_response({"error": {"message": "unrecorded prompt"}}, status=404)
        if body.get("return_logprob") and not logprobs:
            refused = answer["refused"]
            return web.Response(status=refused["status"], text=refused["body"],
                                content_type="application/json")
        return web.json_response(answer["response"])

    async def model_info(request: web.Request) -> web.Response:
        # What `appliance verify` tells SGLang by (its --api auto).
        return web.json_response({"model_path": "/root/stash/models/tiny-kimi",
                                  "is_generation": True})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/model_info", model_info)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    sock = socket.create_server(("127.0.0.1", 0))
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", seen)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


# The recordings answer the twelve prompts they were made with (BUILTIN_PROMPTS, the first
# twelve of the shipped set): the command is given those unless a test chooses others.
RECORDED = Path(tempfile.mkdtemp(prefix="verify-cli-")) / "recorded.jsonl"
RECORDED.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in BUILTIN_PROMPTS))
atexit.register(shutil.rmtree, RECORDED.parent, True)


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    chosen = args if "--prompts" in args else (*args, "--prompts", str(RECORDED))
    return subprocess.run([sys.executable, "-m", "appliance.cli", "verify", *chosen],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def _recorded_parts() -> dict[int, tuple[int, float]]:
    """Prompt number -> (position, B's top-2 gap) of every real divergence."""
    parts = {}
    for index, (b, a) in enumerate(zip(BASE, CAND, strict=True), 1):
        found = first_divergence(b["response"]["output_ids"],
                                 b["response"]["meta_info"]["output_top_logprobs"],
                                 a["response"]["output_ids"])
        if found.position is not None:
            parts[index] = (found.position, found.gap)
    return parts


def test_the_built_in_prompts_are_the_ones_the_threshold_was_measured_on() -> None:
    assert list(BUILTIN_PROMPTS) == [a["prompt"] for a in BASE] == [a["prompt"] for a in CAND]


def test_the_shipped_set_opens_with_the_measured_prompts_and_adds_mt_bench_questions() -> None:
    shipped = shipped_prompts()
    assert shipped[:12] == list(BUILTIN_PROMPTS) and len(shipped) == 36
    lines = [json.loads(line) for line in SHIPPED_PROMPTS_FILE.read_text().splitlines()]
    assert [line["source"] for line in lines[12:]] == [
        f"mt-bench:{q}" for q in (81, 84, 86, 96, 97, 99, 101, 104, 108, 111, 114, 118, 122,
                                  125, 127, 134, 139, 140, 141, 142, 144, 151, 152, 156)]
    assert len(set(shipped)) == 36  # no prompt twice
    readme = (SHIPPED_PROMPTS_FILE.parent / "README.md").read_text()
    assert "Apache License 2.0" in readme and "lm-sys/FastChat" in readme
    assert "Apache License" in (SHIPPED_PROMPTS_FILE.parent / "LICENSE.Apache-2.0.txt").read_text()


def test_ddtree_against_the_baseline_passes_with_the_real_near_ties_at_their_positions() -> None:
    with generate_server(CAND, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    parts = _recorded_parts()
    assert sorted(parts) == [1, 2, 4, 8, 9, 10]  # 33, 32, 12, 12, 12, 51 tokens in
    for p in result["prompts"]:
        if p["index"] in parts:
            assert (p["verdict"], p["position"]) == ("near-tie", parts[p["index"]][0])
            assert p["gap"] == parts[p["index"]][1] <= 0.125
            assert p["a"]["ids"][0] == CAND[p["index"] - 1]["response"]["output_ids"][
                p["position"]]
            assert p["a"]["ids"][0] != p["b"]["ids"][0]
            # The recorded B gave no per-token texts: the texts part where their characters do.
            a_text, b_text = (r[p["index"] - 1]["response"]["text"] for r in (CAND, BASE))
            shared = os.path.commonprefix([a_text, b_text])
            assert (p["a"]["text"], p["b"]["text"]) == (a_text[len(shared):], b_text[len(shared):])
            assert p["a"]["text"] != p["b"]["text"] and p["a"]["text_from"] == "character"
        else:
            assert (p["verdict"], p["position"]) == ("identical", None)
    assert (result["identical"], result["near_ties"], result["failures"]) == (6, 6, 0)
    assert result["match_rate"] == 0.5 and result["passed"] is True
    assert "does not support return_logprob" in result["a_logprobs"]


def test_the_text_report_shows_each_part_side_by_side() -> None:
    with generate_server(CAND, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--max-tokens", "64")
    assert done.returncode == 0, done.stderr
    assert "  1 near-tie  at token 33, B's top-2 gap 0.0000" in done.stdout
    assert " 10 near-tie  at token 51, B's top-2 gap 0.1250" in done.stdout
    assert done.stdout.count("      A: ") == 6 and done.stdout.count("      B: ") == 6
    a_ids = CAND[0]["response"]["output_ids"][33:45]
    assert f"      A: ids {a_ids}  text " in done.stdout
    assert "match rate 6/12, near-ties 6, failures 0 (threshold 0.5)" in done.stdout


def test_only_the_first_refusal_is_asked_of_a_and_b_is_asked_for_its_top_log_probs() -> None:
    with generate_server(CAND, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        assert verify("--a", a.url, "--b", b.url).returncode == 0
    a_seen, b_seen = a.seen, b.seen
    assert [bool(s.get("return_logprob")) for s in a_seen] == [True] + [False] * 12
    assert all(s["return_logprob"] and s["top_logprobs_num"] == TOP_LOGPROBS == 5 for s in b_seen)
    assert all(s["sampling_params"] == {"temperature": 0, "max_new_tokens": 64,
                                        "ignore_eos": True} for s in a_seen + b_seen)


def test_a_divergence_at_a_clear_margin_fails_naming_its_position() -> None:
    # Prompt 3 ("def fibonacci(n):") is identical on the real engine; at its token 2 the
    # baseline's top-2 gap is 4.0625 (> 1): A is made to give B's second choice there.
    planted = copy.deepcopy(CAND)
    top = BASE[2]["response"]["meta_info"]["output_top_logprobs"][2]
    gap = top[0][0] - top[1][0]
    assert gap > 1
    planted[2]["response"]["output_ids"][2] = top[1][1]
    with generate_server(planted, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--json")
    assert done.returncode == 1, done.stderr
    third = json.loads(done.stdout)["prompts"][2]
    assert (third["verdict"], third["position"], third["gap"]) == ("failure", 2, gap)
    assert third["a"]["ids"][0] == top[1][1] and third["b"]["ids"][0] == top[0][1]
    with generate_server(planted, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        text = verify("--a", a.url, "--b", b.url).stdout
    assert "  3 failure   at token 2, B's top-2 gap 4.0625" in text
    assert "failures 1" in text


def test_a_baseline_that_is_not_greedy_at_the_divergence_fails_saying_so() -> None:
    # B (sampled, say) emits its own second choice at prompt 3's token 2, where its top-2
    # gap is 4.0625; A keeps the recorded greedy token (B's top-1). A's token is B's top-1,
    # so measured against B's top-2 gap it would pass as a "near-tie": B's log-probs judge
    # nothing where B itself did not take its top-1, and the check must fail naming that.
    sampled = copy.deepcopy(BASE)
    top = sampled[2]["response"]["meta_info"]["output_top_logprobs"][2]
    b_gap = top[0][0] - top[1][0]
    assert b_gap > 1 and CAND[2]["response"]["output_ids"][2] == top[0][1]
    sampled[2]["response"]["output_ids"][2] = top[1][1]
    with generate_server(CAND, logprobs=False) as a, generate_server(sampled, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--json")
    assert done.returncode == 1, done.stderr
    third = json.loads(done.stdout)["prompts"][2]
    assert (third["verdict"], third["position"], third["baseline_gap"]) == ("not-greedy", 2, b_gap)
    assert json.loads(done.stdout)["failures"] == 1
    with generate_server(CAND, logprobs=False) as a, generate_server(sampled, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url)
    assert done.returncode == 1
    assert (f"  3 not-greedy at token 2, B is not greedy at that token: its own token is "
            f"{b_gap:.4f} below its top-1") in done.stdout
    assert "give a greedy baseline as --b" in done.stdout and "near-tie  at token 2" not in done.stdout
    assert "failures 1" in done.stdout


def test_a_bad_prompts_file_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "The quick brown fox"}\n\n{"text": "no prompt key"}\n')
    done = verify("--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9", "--prompts", str(bad))
    assert done.returncode == 2
    assert 'line 3 has no "prompt" string' in done.stderr and "Traceback" not in done.stderr
    bad.write_text("{not json\n")
    done = verify("--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9", "--prompts", str(bad))
    assert done.returncode == 2 and "line 1 is not JSON" in done.stderr
    done = verify("--a", "http://x", "--b", "http://x", "--prompts", str(tmp_path / "none"))
    assert done.returncode == 2 and "cannot read" in done.stderr
    assert "Traceback" not in done.stderr


def test_nothing_is_sent_when_the_prompts_file_is_bad() -> None:
    with generate_server(CAND, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        path = ROOT / "tests" / "fixtures" / "real-engine" / "README.md"  # not JSONL
        assert verify("--a", a.url, "--b", b.url, "--prompts", str(path)).returncode == 2
    assert a.seen == b.seen == []


def test_a_jsonl_file_chooses_the_prompts(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps({"prompt": BASE[i]["prompt"]}) + "\n" for i in (2, 0)))
    with generate_server(CAND, logprobs=False) as a, generate_server(BASE, logprobs=True) as b:
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(path), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(p["prompt"], p["verdict"]) for p in result["prompts"]] == [
        (BASE[2]["prompt"], "identical"), (BASE[0]["prompt"], "near-tie")]
    assert [s["text"] for s in b.seen] == [BASE[2]["prompt"], BASE[0]["prompt"]]


def test_an_unreachable_server_or_a_bad_url_is_a_usage_error() -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    with generate_server(BASE, logprobs=True) as b:
        done = verify("--a", f"http://127.0.0.1:{port}", "--b", b.url)
    assert done.returncode == 2
    assert f"http://127.0.0.1:{port} is unreachable" in done.stderr
    assert "Traceback" not in done.stderr
    done = verify("--a", "127.0.0.1:30000", "--b", "http://127.0.0.1:30001")
    assert done.returncode == 2 and "--a: '127.0.0.1:30000' is not an http(s) URL" in done.stderr


def test_a_baseline_that_refuses_logprobs_is_a_usage_error() -> None:
    with generate_server(CAND, logprobs=False) as a, generate_server(CAND, logprobs=False) as b:
        done = verify("--a", a.url, "--b", b.url)
    assert done.returncode == 2
    assert "give a server without speculation as --b" in done.stderr


def test_where_b_gives_each_tokens_text_the_continuations_start_at_the_divergent_token(
        tmp_path: Path) -> None:
    # The recorded B was not asked for token texts; here each token's text is made "<id> "
    # on both sides (answer text = the tokens' texts joined), as return_text_in_logprobs gives.
    def spelled(answer: dict[str, Any], *, texts: bool) -> dict[str, Any]:
        out = copy.deepcopy(answer)
        ids = out["response"]["output_ids"]
        out["response"]["text"] = "".join(f"{i} " for i in ids)
        if texts:
            logprobs = out["response"]["meta_info"]["output_token_logprobs"]
            for entry, token in zip(logprobs, ids, strict=True):
                entry[2] = f"{token} "
        return out

    with generate_server([spelled(CAND[0], texts=False)], logprobs=False) as a, \
            generate_server([spelled(BASE[0], texts=True)], logprobs=True) as b:
        path = tmp_path / "one.jsonl"
        path.write_text(json.dumps({"prompt": BASE[0]["prompt"]}) + "\n")
        done = verify("--a", a.url, "--b", b.url, "--prompts", str(path), "--json")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)["prompts"][0]
    a_ids, b_ids = (r[0]["response"]["output_ids"][33:] for r in (CAND, BASE))
    assert first["a"]["text"] == "".join(f"{i} " for i in a_ids)
    assert first["b"]["text"] == "".join(f"{i} " for i in b_ids)
    assert first["a"]["text_from"] == "token"
