"""The test engine image behaves like SGLang at the container boundary (real Docker)."""

from __future__ import annotations

import re
import threading
import time

import pytest
import requests
from docker.models.containers import Container

from tests.conftest_docker import (  # noqa: F401 (fixtures)
    ddtree_argv,
    docker_client,
    health_code,
    host_port,
    run_test_engine,
    test_engine_image,
    wait_for,
)

pytestmark = pytest.mark.docker

RANK_PREFIX = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} TP(\d+)\] ")


def stderr_of(container: Container) -> str:
    return container.logs(stdout=False, stderr=True).decode()


def stdout_of(container: Container) -> str:
    return container.logs(stdout=True, stderr=False).decode()


def url_of(container: Container) -> str:
    return f"http://127.0.0.1:{host_port(container)}"


def wait_ready(container: Container) -> str:
    url = url_of(container)
    wait_for(lambda: health_code(url) == 200, 30)
    return url


def exit_code(container: Container, timeout_s: float = 30) -> int:
    return int(container.wait(timeout=timeout_s)["StatusCode"])


def positions(text: str, markers: list[str]) -> list[int]:
    found = [text.find(m) for m in markers]
    missing = [m for m, pos in zip(markers, found, strict=True) if pos < 0]
    assert not missing, f"missing log lines: {missing}"
    return found


def test_health_answers_503_while_loading_then_200_when_ready(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_SHARDS": "40"})
    url = url_of(container)
    codes: list[int] = []
    wait_for(lambda: codes.append(health_code(url)) or codes[-1] == 200, 30, every_s=0.02)
    answered = [c for c in codes if c]
    assert answered[0] == 503
    assert answered[-1] == 200


def test_it_prints_sglang_startup_lines_in_order_on_stderr(run_test_engine):  # noqa: F811
    container = run_test_engine()
    wait_ready(container)
    err = stderr_of(container)
    order = positions(err, [
        "server_args=ServerArgs(",
        "TP0] Load weight begin. avail mem=",
        "TP1] Load weight begin. avail mem=",
        "\rMulti-thread loading shards:   0% Completed | 0/8",
        "Multi-thread loading shards: 100% Completed | 8/8",
        "TP0] Load weight end. elapsed=",
        # 433c58ed7's order: the drafter's weights, then both KV pools, then the graphs.
        " s, type=DFlashDraftModel,",
        "TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: ",
        "TP0] Memory pool end. avail mem=",
        "TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, K size: ",
        "TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=33, "
        "bs=[1, 2, 4, 8, 16], avail mem=",
        "\rCapturing batches (bs=16 avail_mem=",
        "Capturing batches (bs=1 avail_mem=",
        "TP1] Capture target verify CUDA graph end. elapsed=",
        "TP0] Capture draft verify CUDA graph begin. backend=full, num_tokens_per_req=8, "
        "bs=[1, 2, 4, 8, 16]",
        "TP0] Capture draft verify CUDA graph end. elapsed=",
        "The server is fired up and ready to roll!",
    ])
    assert order == sorted(order)
    # Each load's elapsed is the time it took (8 target shards and 1 drafter shard, at
    # TEST_ENGINE_PACE_S=0.01 each), as SGLang prints its own: never a load it did not do.
    loads = re.findall(r"TP0\] Load weight end\. elapsed=(\d+\.\d+) s, type=(\w+)", err)
    assert [model for _, model in loads] == ["DeepseekV3ForCausalLM", "DFlashDraftModel"]
    target, draft = (float(seconds) for seconds, _ in loads)
    assert 0.075 <= target < 3.0 and 0.005 <= draft < 1.0, loads
    ranks = {m.group(1) for line in err.splitlines() if (m := RANK_PREFIX.match(line))}
    assert ranks == {"0", "1"}
    assert "The server is fired up" not in stdout_of(container)


def test_progress_bars_redraw_with_carriage_returns_inside_one_line(run_test_engine):  # noqa: F811
    container = run_test_engine()
    wait_ready(container)
    shard_line = next(line for line in stderr_of(container).split("\n")
                      if "Multi-thread loading shards" in line)
    updates = [u for u in shard_line.split("\r") if u]
    assert len(updates) == 9  # 0/8 .. 8/8
    assert re.fullmatch(
        r"Multi-thread loading shards:  50% Completed \| 4/8 \[\d\d:\d\d<\d\d:\d\d, "
        r"\s*[\d.]+s/it\]", updates[4].rstrip())


def test_old_log_style_prints_the_older_generation_lines(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_LOG_STYLE": "old"})
    wait_ready(container)
    err = stderr_of(container)
    order = positions(err, [
        "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=",
        "KV Cache is allocated. #tokens: ",
        "Capture cuda graph begin. This can take up to several minutes. avail mem=",
        "Capture cuda graph end. Time elapsed: ",
        "Capture draft cuda graph begin. This can take up to several minutes.",
        "The server is fired up and ready to roll!",
    ])
    assert order == sorted(order)
    assert "num_tokens_per_req" not in err


def test_streaming_chat_sends_openai_chunks_then_done(run_test_engine):  # noqa: F811
    container = run_test_engine()
    url = wait_ready(container)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
            "stream": True}
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=10) as r:
        events = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-1])
    assert '"finish_reason": "length"' in events[-2]
    assert len(events) >= 4  # role, at least one content delta, finish, done


def test_serving_prints_decode_batch_lines_and_access_lines_on_stdout(run_test_engine):  # noqa: F811
    argv = ddtree_argv() + ["--decode-log-interval", "1"]
    container = run_test_engine(argv=argv)
    url = wait_ready(container)
    r = requests.post(f"{url}/generate", timeout=10,
                      json={"text": "hello", "sampling_params": {"max_new_tokens": 24}})
    assert r.status_code == 200 and r.json()["text"]
    err = wait_for(lambda: (e := stderr_of(container)) and "Decode batch" in e and e)
    decode = next(line for line in err.splitlines() if "Decode batch" in line)
    assert re.match(
        r"\[[\d\- :]+ TP0\] Decode batch, #running-req: 1, #token: \d+, token usage: [\d.]+, "
        r"accept len: [\d.]+, accept rate: [\d.]+, cuda graph: True, "
        r"gen throughput \(token/s\): [\d.]+, #queue-req: 0$", decode)
    assert 'INFO:     ' in stdout_of(container)
    assert '"POST /generate HTTP/1.1" 200 OK' in stdout_of(container)


def test_server_info_and_metrics_report_speculative_stats(run_test_engine):  # noqa: F811
    container = run_test_engine()
    url = wait_ready(container)
    requests.post(f"{url}/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 16}},
                  timeout=10)
    info = requests.get(f"{url}/get_server_info", timeout=5).json()
    assert info["speculative_algorithm"] == "DDTREE"
    assert info["speculative_ddtree_budget"] == 32
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1
    assert info["version"]
    metrics = requests.get(f"{url}/metrics", timeout=5).text
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in metrics
    assert re.search(r"^sglang:is_cuda_graph\{.*\} 1\.0$", metrics, re.M)
    assert re.search(r"^sglang:generation_tokens_total\{.*\} 16\.0$", metrics, re.M)
    models = requests.get(f"{url}/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "/models/kimi-k2.6"


def test_load_exit_fails_during_weight_loading_with_a_traceback(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_FAIL": "load-exit"})
    assert exit_code(container) == 1
    err = stderr_of(container)
    assert "TP0] Scheduler hit an exception: Traceback (most recent call last):" in err
    assert "safetensors_rust.SafetensorError: Error while deserializing header" in err
    assert "Load weight end" not in err


def test_capture_oom_fails_during_graph_capture_with_cuda_oom(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_FAIL": "capture-oom"})
    assert exit_code(container) == 1
    err = stderr_of(container)
    positions(err, ["Capture target verify CUDA graph begin", "Capturing batches (bs=",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
                    "Exception: Capture cuda graph failed: CUDA out of memory."])
    assert "fired up" not in err


def test_ddtree_width_crashes_on_the_first_request_after_ready(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_FAIL": "ddtree-width"})
    url = wait_ready(container)
    with pytest.raises(requests.RequestException):
        requests.post(f"{url}/generate", json={"text": "a"}, timeout=10)
    assert exit_code(container) == 1
    err = stderr_of(container)
    order = positions(err, [
        "The server is fired up and ready to roll!",
        'cuda_graph_runner.py", line 1303, in replay',
        "RuntimeError: The size of tensor a (8) must match the size of tensor b (33) "
        "at non-singleton dimension 0",
    ])
    assert order == sorted(order)


def test_hang_load_never_gets_ready_and_sigterm_ends_it_promptly(run_test_engine):  # noqa: F811
    container = run_test_engine(env={"TEST_ENGINE_FAIL": "hang-load"})
    url = url_of(container)
    wait_for(lambda: "Load weight begin" in stderr_of(container))
    time.sleep(1.0)
    assert health_code(url) == 503
    assert "Load weight end" not in stderr_of(container)
    started = time.monotonic()
    container.stop(timeout=20)
    assert time.monotonic() - started < 5
    assert exit_code(container) == 0


def test_ddtree_eager_serves_without_cuda_graphs_and_says_so(run_test_engine):  # noqa: F811
    argv = ddtree_argv() + ["--decode-log-interval", "1"]
    container = run_test_engine(argv=argv, env={"TEST_ENGINE_FAIL": "ddtree-eager"})
    url = wait_ready(container)
    r = requests.post(f"{url}/generate", timeout=10,
                      json={"text": "a", "sampling_params": {"max_new_tokens": 16}})
    assert r.status_code == 200
    wait_for(lambda: "cuda graph: False, gen throughput" in stderr_of(container))
    metrics = requests.get(f"{url}/metrics", timeout=5).text
    assert re.search(r"^sglang:is_cuda_graph\{.*\} 0\.0$", metrics, re.M)


def baseline_argv(*extra: str) -> list[str]:
    return ["python3", "-m", "sglang.launch_server", "--model-path", "/models/base",
            "--host", "0.0.0.0", "--port", "30000", "--enable-metrics", *extra]


def metric(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^sglang:{name}(?:\{{[^}}]*\}})? ([\d.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_batch_limit_queues_requests_past_it_at_a_fixed_time_per_token(run_test_engine):  # noqa: F811
    # 2 running at once, 10 tokens at 50 ms: 6 requests take three rounds of ~0.5 s.
    container = run_test_engine(argv=baseline_argv("--max-running-requests", "2"),
                                env={"TEST_ENGINE_TOKEN_S": "0.05"})
    url = wait_ready(container)
    done: list[float] = []
    queued: list[float] = []
    start = time.monotonic()

    def one(i: int) -> None:
        requests.post(f"{url}/v1/completions", json={"prompt": f"p{i}", "max_tokens": 10},
                      timeout=30).raise_for_status()
        done.append(time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(0.25)
    queued.append(metric(url, "num_queue_reqs"))
    running = metric(url, "num_running_reqs")
    for thread in threads:
        thread.join()
    assert (running, queued[0]) == (2.0, 4.0)
    rounds = sorted(round(t / 0.5) for t in done)
    assert rounds == [1, 1, 2, 2, 3, 3], sorted(done)
    assert re.search(r"Prefill batch, .*#queue-req: [1-4],", stderr_of(container))


def test_a_shared_prefix_is_reported_cached_as_sglang_reports_it(run_test_engine):  # noqa: F811
    container = run_test_engine(argv=baseline_argv("--enable-cache-report"))
    url = wait_ready(container)
    system = "you are a careful assistant " * 20  # 100 words

    def complete(question: str) -> dict[str, object]:
        answer = requests.post(f"{url}/v1/completions", timeout=10, json={
            "prompt": system + question, "max_tokens": 4})
        return answer.json()["usage"]

    first, second = complete("what is one"), complete("what is two")
    assert first["prompt_tokens_details"] is None  # nothing cached: null, as SGLang says it
    assert second["prompt_tokens_details"] == {"cached_tokens": 102}  # the prefix and "what is"
    whole = requests.post(f"{url}/generate", timeout=10, json={
        "text": system + "what is one", "sampling_params": {"max_new_tokens": 2}}).json()
    # the same prompt again: all but its last token, as the recordings' #new-token: 1
    assert whole["meta_info"]["cached_tokens"] == 102
    assert whole["meta_info"]["cached_tokens_details"] == {"device": 102, "host": 0}
    assert metric(url, "cached_tokens_total") == 204.0
    assert metric(url, "prompt_tokens_total") == 3 * 103.0
    assert metric(url, "cache_hit_rate") == 102 / 103
    assert "#new-token: 1, #cached-token: 102," in stderr_of(container)


def test_without_the_cache_report_flag_usage_names_no_cached_tokens(run_test_engine):  # noqa: F811
    container = run_test_engine(argv=baseline_argv())
    url = wait_ready(container)
    for _ in range(2):
        usage = requests.post(f"{url}/v1/completions", timeout=10, json={
            "prompt": "the same prompt twice", "max_tokens": 2}).json()["usage"]
    assert usage["prompt_tokens_details"] is None  # the recordings' streams, run without it
    assert metric(url, "cached_tokens_total") == 3.0  # the engine cached it all the same
