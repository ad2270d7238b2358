"""The test engine's `python3 -m sglang.launch_server`: NOT SGLang, a test stand-in.

Used only by the appliance's test suite. It accepts SGLang's real launch flags,
prints SGLang's real log lines in SGLang's order and on SGLang's streams (logging
and tqdm on stderr, uvicorn access lines on stdout), and serves SGLang's HTTP
endpoints. Formats are copied from the SGLang 0.5.23 wheel ("new") and from the
pre-0.5.12 generation ("old"); see docker/test-engine/README.md for the knobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang import __version__

SITE = "/usr/local/lib/python3.12/dist-packages"
SRT = f"{SITE}/sglang/srt"
TOTAL_MEM_GB = 139.81
HIST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


PACE_S = env_float("TEST_ENGINE_PACE_S", 0.05)
TOKEN_S = env_float("TEST_ENGINE_TOKEN_S", 0.002)
SHARDS = int(env_float("TEST_ENGINE_SHARDS", 8))
FAIL = os.environ.get("TEST_ENGINE_FAIL", "").strip()
STYLE = os.environ.get("TEST_ENGINE_LOG_STYLE", "new").strip().lower()
ACCEPT_LEN = env_float("TEST_ENGINE_ACCEPT_LEN", 4.87)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the SGLang flags the test engine acts on; every other flag is accepted."""
    p = argparse.ArgumentParser(prog="sglang.launch_server (test engine)")
    p.add_argument("--model-path", "--model", dest="model_path", default="/models/test")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-dflash-block-size", type=int, default=None)
    p.add_argument("--speculative-ddtree-budget", type=int, default=None)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--decode-log-interval", type=int, default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    args, _unknown = p.parse_known_args(argv)
    return args


@dataclass
class Config:
    """The launch as the test engine understands it (derived like SGLang's ServerArgs)."""

    args: argparse.Namespace
    algo: str
    block: int
    budget: int
    capture_bs: list[int]
    decode_log_interval: int
    context_len: int
    max_running: int

    @property
    def speculative(self) -> bool:
        return self.algo != "NONE"

    @property
    def model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path

    @property
    def verify_width(self) -> int:
        # DDTree verifies budget+1 tokens per request; DFlash verifies the block.
        return self.budget + 1 if self.algo == "DDTREE" else self.block


def capture_bs_list(max_bs: int | None) -> list[int]:
    """SGLang's capture buckets: 1, 2, 4, 8, then steps of 8, up to the max."""
    top = max_bs or 8
    buckets = [b for b in [1, 2, 4, 8] + list(range(16, top + 1, 8)) if b <= top]
    if top not in buckets:
        buckets.append(top)
    return buckets


def make_config(args: argparse.Namespace) -> Config:
    algo = (args.speculative_algorithm or "NONE").upper()
    block = args.speculative_num_draft_tokens or args.speculative_dflash_block_size or 16
    budget = args.speculative_ddtree_budget or max(block - 1, 1)
    interval = args.decode_log_interval or int(env_float("TEST_ENGINE_DECODE_LOG_INTERVAL", 4))
    max_running = args.max_running_requests or (48 if algo in ("DFLASH", "DDTREE") else 256)
    return Config(
        args=args,
        algo=algo,
        block=block,
        budget=budget,
        capture_bs=capture_bs_list(args.cuda_graph_max_bs),
        decode_log_interval=max(interval, 1),
        context_len=args.context_length or 262144,
        max_running=max_running,
    )


# ---------------------------------------------------------------- output

_out_lock = threading.Lock()


def now_str() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def emit(stream: Any, text: str) -> None:
    with _out_lock:
        stream.write(text)
        stream.flush()


def log(msg: str, rank: int | None = None, pace: bool = True) -> None:
    """One logging line as SGLang's configure_logger formats it (stderr)."""
    prefix = f" TP{rank}" if rank is not None else ""
    emit(sys.stderr, f"[{now_str()}{prefix}] {msg}\n")
    if pace:
        time.sleep(PACE_S)


def log_ranks(cfg: Config, msg_for_rank: Any) -> None:
    """A line every TP rank's scheduler process prints."""
    for rank in range(cfg.args.tp_size):
        log(msg_for_rank(rank), rank)


def fmt_clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


def fmt_rate(sec_per_it: float) -> str:
    if sec_per_it <= 0:
        return "?it/s"
    if sec_per_it >= 1:
        return f"{sec_per_it:5.2f}s/it"
    return f"{1 / sec_per_it:5.2f}it/s"


class Bar:
    """tqdm on stderr: every refresh starts with '\\r', close ends the line with '\\n'."""

    def __init__(self, total: int, desc: str = "", sglang_format: bool = False) -> None:
        self.total, self.n, self.desc = total, 0, desc
        self.sglang_format = sglang_format
        self.sec_per_it = 0.0
        self.last_len = 0
        self.refresh()

    def render(self) -> str:
        pct = 100 * self.n / self.total if self.total else 100
        elapsed = self.n * self.sec_per_it
        remaining = (self.total - self.n) * self.sec_per_it
        times = (
            f"[{fmt_clock(elapsed)}<{fmt_clock(remaining)}, {fmt_rate(self.sec_per_it)}]"
            if self.n
            else "[00:00<?, ?it/s]"
        )
        if self.sglang_format:  # sglang.srt.utils.common.BAR_FORMAT
            return f"{self.desc}: {pct:3.0f}% Completed | {self.n}/{self.total} {times}"
        filled = int(10 * self.n / self.total) if self.total else 10
        bar = ("█" * filled).ljust(10)
        head = f"{self.desc}: " if self.desc else ""
        return f"{head}{pct:3.0f}%|{bar}| {self.n}/{self.total} {times}"

    def refresh(self) -> None:
        text = self.render()
        emit(sys.stderr, "\r" + text + " " * max(self.last_len - len(text), 0))
        self.last_len = len(text)

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.refresh()

    def update(self, sec_per_it: float) -> None:
        self.n += 1
        self.sec_per_it = sec_per_it
        self.refresh()

    def close(self) -> None:
        emit(sys.stderr, "\n")


def traceback_text(frames: list[tuple[str, int, str, str]], error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines.append(f'  File "{path}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    lines.append(error)
    return "\n".join(lines)


def scheduler_crash(cfg: Config, tb: str) -> None:
    """How SGLang reports a dead scheduler: per rank, then the parent's SIGQUIT note."""
    for rank in range(cfg.args.tp_size):
        log(f"Scheduler hit an exception: {tb}\n", rank)
    log("Received sigquit from a child process. It usually means the child failed.")
    sys.stderr.flush()
    os._exit(1)


SCHED_FRAMES = [
    (f"{SRT}/managers/scheduler.py", 3806, "run_scheduler_process",
     "scheduler.event_loop_normal()"),
    (f"{SITE}/torch/utils/_contextlib.py", 120, "decorate_context",
     "return func(*args, **kwargs)"),
    (f"{SRT}/managers/scheduler.py", 1523, "event_loop_normal",
     "result = self.run_batch(batch)"),
    (f"{SRT}/managers/scheduler.py", 2981, "run_batch",
     "batch_result = self.model_worker.forward_batch_generation("),
]


def ddtree_width_traceback(cfg: Config) -> str:
    frames = SCHED_FRAMES + [
        (f"{SRT}/speculative/ddtree_worker.py", 412, "forward_batch_generation",
         "logits_output, can_run_cuda_graph = self.verify(batch, tree)"),
        (f"{SRT}/speculative/ddtree_worker.py", 538, "verify",
         "batch_result = self.target_worker.forward_batch_generation("),
        (f"{SRT}/managers/tp_worker.py", 470, "forward_batch_generation",
         "out = self.model_runner.forward("),
        (f"{SRT}/model_executor/model_runner.py", 3153, "forward",
         "output = self._forward_raw("),
        (f"{SRT}/model_executor/model_runner.py", 3223, "_forward_raw",
         "ret = self.graph_runner.replay("),
        (f"{SRT}/model_executor/cuda_graph_runner.py", 1303, "replay",
         "self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)"),
    ]
    err = (
        f"RuntimeError: The size of tensor a ({cfg.block}) must match the size of tensor b "
        f"({cfg.verify_width}) at non-singleton dimension 0"
    )
    return traceback_text(frames, err)


def capture_oom_traceback(rank: int) -> str:
    init = [
        (f"{SRT}/managers/scheduler.py", 3790, "run_scheduler_process",
         "scheduler = Scheduler("),
        (f"{SRT}/managers/scheduler.py", 402, "__init__", "self.init_model_worker()"),
        (f"{SRT}/managers/tp_worker.py", 246, "__init__", "self._init_model_runner()"),
        (f"{SRT}/model_executor/model_runner.py", 418, "__init__",
         "self.initialize(min_per_gpu_memory)"),
        (f"{SRT}/model_executor/model_runner.py", 612, "initialize", "self.init_device_graphs()"),
        (f"{SRT}/model_executor/model_runner.py", 2788, "init_device_graphs",
         "self.graph_runner = graph_runners[self.device](self)"),
    ]
    inner = traceback_text(
        [
            (f"{SRT}/model_executor/cuda_graph_runner.py", 598, "__init__", "self.capture()"),
            (f"{SRT}/model_executor/cuda_graph_runner.py", 881, "capture",
             ") = self.capture_one_batch_size(bs, forward, stream_idx)"),
            (f"{SRT}/model_executor/cuda_graph_runner.py", 1042, "capture_one_batch_size",
             "run_once()"),
            (f"{SITE}/torch/cuda/graphs.py", 186, "__exit__", "self.cuda_graph.capture_end()"),
        ],
        oom_message(rank, prefix="torch.OutOfMemoryError: "),
    )
    outer = traceback_text(
        init + [(f"{SRT}/model_executor/cuda_graph_runner.py", 600, "__init__",
                 "raise Exception(")],
        f"Exception: Capture cuda graph failed: {oom_message(rank)}\n"
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
        "3. disable torch compile by not using --enable-torch-compile\n"
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n",
    )
    during = "\n\nDuring handling of the above exception, another exception occurred:\n\n"
    return inner + during + outer


def oom_message(rank: int, prefix: str = "") -> str:
    return (
        f"{prefix}CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total "
        f"capacity of {TOTAL_MEM_GB:.2f} GiB of which 1.12 GiB is free. Including non-PyTorch "
        "memory, this process has 138.68 GiB memory in use. Of the allocated memory 130.20 GiB "
        "is allocated by PyTorch, and 1.45 GiB is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def load_exit_traceback(cfg: Config, shard: int) -> str:
    path = f"{cfg.args.model_path}/model-{shard:05d}-of-{SHARDS:05d}.safetensors"
    frames = [
        (f"{SRT}/managers/scheduler.py", 3790, "run_scheduler_process", "scheduler = Scheduler("),
        (f"{SRT}/managers/scheduler.py", 402, "__init__", "self.init_model_worker()"),
        (f"{SRT}/managers/tp_worker.py", 246, "__init__", "self._init_model_runner()"),
        (f"{SRT}/model_executor/model_runner.py", 418, "__init__",
         "self.initialize(min_per_gpu_memory)"),
        (f"{SRT}/model_executor/model_runner.py", 540, "initialize", "self.load_model()"),
        (f"{SRT}/model_executor/model_runner.py", 1420, "load_model",
         "self.model = get_model("),
        (f"{SRT}/model_loader/loader.py", 687, "load_model",
         "self.load_weights_and_postprocess("),
        (f"{SRT}/model_loader/weight_utils.py", 884, "safetensors_weights_iterator",
         'with safetensors.safe_open(st_file, framework="pt", device="cpu") as f:'),
    ]
    return traceback_text(
        frames,
        "safetensors_rust.SafetensorError: Error while deserializing header: "
        f"MetadataIncompleteBuffer (file {path})",
    )


# ---------------------------------------------------------------- engine state


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(HIST_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(HIST_BUCKETS):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class State:
    ready: bool = False
    running: int = 0
    queued: int = 0
    decode_steps: int = 0
    tokens_in_use: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests: int = 0
    last_gen_throughput: float = 0.0
    accept_tokens: int = 0
    verify_steps: int = 0
    weight_load_s: float = 0.0
    first_request_seen: bool = False
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def avg_accept(self) -> float:
        return self.accept_tokens / self.verify_steps if self.verify_steps else 0.0


CFG: Config
STATE = State()
MAX_TOKENS_POOL = 1048576


# ---------------------------------------------------------------- startup phases


def server_args_dict(cfg: Config) -> dict[str, Any]:
    a = cfg.args
    return {
        "model_path": a.model_path,
        "served_model_name": cfg.model_name,
        "tp_size": a.tp_size,
        "dp_size": a.dp_size,
        "speculative_algorithm": None if cfg.algo == "NONE" else cfg.algo,
        "speculative_draft_model_path": a.speculative_draft_model_path,
        "speculative_num_draft_tokens": cfg.block if cfg.speculative else None,
        "speculative_ddtree_budget": cfg.budget if cfg.algo == "DDTREE" else None,
        "attention_backend": a.attention_backend,
        "cuda_graph_max_bs": max(cfg.capture_bs),
        "disable_cuda_graph": a.disable_cuda_graph,
        "mem_fraction_static": a.mem_fraction_static or 0.88,
        "context_length": a.context_length,
        "max_running_requests": cfg.max_running,
        "decode_log_interval": cfg.decode_log_interval,
        "trust_remote_code": a.trust_remote_code,
        "enable_metrics": a.enable_metrics,
        "host": a.host,
        "port": a.port,
    }


def print_server_args(cfg: Config) -> None:
    inner = ", ".join(f"{k}={v!r}" for k, v in server_args_dict(cfg).items())
    log(f"server_args=ServerArgs({inner})")


def load_weights(cfg: Config, role: str) -> None:
    """Load weight begin (every rank), shard progress (rank 0), Load weight end (every rank)."""
    log_ranks(cfg, lambda r: f"Load weight begin. avail mem={137.52 - 0.01 * r:.2f} GB")
    shards = SHARDS if role == "target" else 1
    bar = Bar(shards, "Loading safetensors checkpoint shards", sglang_format=True)
    for i in range(shards):
        time.sleep(PACE_S)
        if FAIL == "hang-load" and role == "target" and i == shards // 2:
            while True:  # never ready; only SIGTERM ends this
                time.sleep(3600)
        if FAIL == "load-exit" and role == "target" and i == shards // 2:
            bar.close()
            scheduler_crash(cfg, load_exit_traceback(cfg, i + 1))
        bar.update(5.05)
    bar.close()
    STATE.weight_load_s = 5.05 * shards
    model_type = "DFlashDraftModel" if role == "draft" else os.environ.get(
        "TEST_ENGINE_MODEL_TYPE", "DeepseekV3ForCausalLM")
    usage = 74.34 if role == "target" else 1.87
    log_ranks(cfg, lambda r: load_end_line(model_type, STATE.weight_load_s, usage))


def load_end_line(model_type: str, elapsed: float, usage: float) -> str:
    avail = 137.52 - usage
    if STYLE == "old":
        return (f"Load weight end. type={model_type}, dtype=torch.bfloat16, "
                f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.")
    quant = "quant=fp8, " if model_type != "DFlashDraftModel" else ""
    return (f"Load weight end. elapsed={elapsed:.2f} s, type={model_type}, {quant}"
            f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.")


def kv_cache_line() -> str:
    if STYLE == "old":
        return f"KV Cache is allocated. #tokens: {MAX_TOKENS_POOL}, KV size: 35.12 GB"
    return (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {MAX_TOKENS_POOL}, "
            "KV size: 35.12 GB")


def capture(cfg: Config, role: str) -> None:
    """One CUDA-graph capture: begin (every rank), per-bs progress (rank 0), end."""
    if cfg.args.disable_cuda_graph:
        return
    kind = "verify" if cfg.speculative else "decode"
    # The bug this product exists for: DFLASH and DDTREE both capture with the block size.
    per_req = cfg.block if cfg.speculative else 1
    log_ranks(cfg, lambda r: capture_begin_line(role, kind, per_req))
    bar = Bar(len(cfg.capture_bs))
    avail = 20.11
    for i, bs in enumerate(reversed(cfg.capture_bs)):
        bar.set_description(f"Capturing batches (bs={bs} avail_mem={avail:.2f} GB)")
        time.sleep(PACE_S)
        if FAIL == "capture-oom" and role == "target" and i == 1:
            bar.close()
            for rank in range(cfg.args.tp_size):
                log(f"Scheduler hit an exception: {capture_oom_traceback(rank)}", rank)
            log("Received sigquit from a child process. It usually means the child failed.")
            os._exit(1)
        avail -= 0.09
        bar.update(1.20)
    bar.close()
    log_ranks(cfg, lambda r: capture_end_line(cfg, role, kind, avail))


def capture_begin_line(role: str, kind: str, per_req: int) -> str:
    if STYLE == "old":
        what = "draft cuda graph" if role == "draft" else "cuda graph"
        return f"Capture {what} begin. This can take up to several minutes. avail mem=20.11 GB"
    return (f"Capture {role} {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={per_req}, avail mem=20.11 GB")


def capture_end_line(cfg: Config, role: str, kind: str, avail: float) -> str:
    usage = 20.11 - avail
    elapsed = 1.20 * len(cfg.capture_bs)
    if STYLE == "old":
        what = "draft cuda graph" if role == "draft" else "cuda graph"
        return (f"Capture {what} end. Time elapsed: {elapsed:.2f} s. "
                f"mem usage={usage:.2f} GB. avail mem={avail:.2f} GB.")
    return (f"Capture {role} {kind} CUDA graph end. bs={cfg.capture_bs}, "
            f"elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.")


def start_up(cfg: Config) -> None:
    print_server_args(cfg)
    load_weights(cfg, "target")
    log_ranks(cfg, lambda r: kv_cache_line())
    capture(cfg, "target")
    if cfg.speculative:
        load_weights(cfg, "draft")
        capture(cfg, "draft")
    log(f"max_total_num_tokens={MAX_TOKENS_POOL}, chunked_prefill_size=8192, "
        f"max_prefill_tokens=16384, max_running_requests={cfg.max_running}, "
        f"context_len={cfg.context_len}, available_gpu_mem=18.62 GB", 0)
    for line in ("Started server process [1]", "Waiting for application startup.",
                 "Application startup complete.",
                 f"Uvicorn running on http://{cfg.args.host}:{cfg.args.port} "
                 "(Press CTRL+C to quit)"):
        emit(sys.stderr, f"INFO:     {line}\n")
    warm_up(cfg)
    STATE.ready = True
    log("The server is fired up and ready to roll!")


def warm_up(cfg: Config) -> None:
    """SGLang's warmup: GET /model_info then a short POST /generate (prefill only here)."""
    access_line("GET", "/model_info", 200)
    prefill_line(6, 0)
    access_line("POST", "/generate", 200)


def access_line(method: str, path: str, status: int, client: str = "127.0.0.1:41234") -> None:
    """uvicorn's access log: its own handler on stdout."""
    phrase = {200: "OK", 404: "Not Found", 503: "Service Unavailable", 400: "Bad Request"}
    emit(sys.stdout, f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} '
                     f'{phrase.get(status, "")}\n')


def prefill_line(new_tokens: int, running: int) -> None:
    usage = STATE.tokens_in_use / MAX_TOKENS_POOL
    msg = (f"Prefill batch, #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, "
           f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: 0, ")
    if STYLE == "old":
        log(msg, 0, pace=False)
    else:
        log(msg + "#pending-token: 0, cuda graph: False, input throughput (token/s): "
            f"{new_tokens / 0.05:.2f}", 0, pace=False)


def decode_line(cfg: Config) -> None:
    usage = STATE.tokens_in_use / MAX_TOKENS_POOL
    msg = (f"Decode batch, #running-req: {STATE.running}, #token: {STATE.tokens_in_use}, "
           f"token usage: {usage:.2f}, ")
    if cfg.speculative:
        rate = (STATE.avg_accept - 1) / max(cfg.block - 1, 1)
        msg += f"accept len: {STATE.avg_accept:.2f}, accept rate: {min(rate, 1.0):.2f}, "
    msg += (f"cuda graph: {cuda_graph_on(cfg)}, "
            f"gen throughput (token/s): {STATE.last_gen_throughput:.2f}, "
            f"#queue-req: {STATE.queued}")
    log(msg + (", " if STYLE == "old" else ""), 0, pace=False)


def cuda_graph_on(cfg: Config) -> bool:
    return not cfg.args.disable_cuda_graph and FAIL != "ddtree-eager"


# ---------------------------------------------------------------- generation

WORDS = ("the", "draft", "tree", "verifies", "tokens", "in", "one", "forward", "pass", "and",
         "accepts", "a", "longer", "prefix", "so", "decoding", "runs", "faster")


def generate(cfg: Config, prompt_tokens: int, max_tokens: int) -> Iterator[str]:
    """Yield text pieces, one per decode step; keeps the counters SGLang reports."""
    maybe_crash_on_first_request(cfg)
    start = time.perf_counter()
    rng = random.Random(prompt_tokens * 7919 + max_tokens)
    with STATE.lock:
        STATE.running += 1
        STATE.num_requests += 1
        STATE.prompt_tokens += prompt_tokens
        STATE.tokens_in_use += prompt_tokens
        prefill_line(prompt_tokens, STATE.running - 1)
    produced, last = 0, start
    try:
        while produced < max_tokens:
            time.sleep(TOKEN_S)
            n = step_tokens(cfg, rng, max_tokens - produced)
            piece = "".join(" " + WORDS[(produced + i) % len(WORDS)] for i in range(n))
            t = time.perf_counter()
            record_step(cfg, n, t - last, first=produced == 0, since_start=t - start)
            produced, last = produced + n, t
            yield piece
    finally:
        with STATE.lock:
            STATE.running -= 1
            STATE.tokens_in_use -= prompt_tokens + produced
            STATE.e2e.observe(time.perf_counter() - start)


def step_tokens(cfg: Config, rng: random.Random, left: int) -> int:
    if not cfg.speculative:
        return 1
    accepted = max(1, min(cfg.block, round(rng.gauss(ACCEPT_LEN, 1.0))))
    return min(accepted, left)


def record_step(cfg: Config, n: int, gap: float, first: bool, since_start: float) -> None:
    with STATE.lock:
        STATE.generation_tokens += n
        STATE.tokens_in_use += n
        STATE.decode_steps += 1
        STATE.accept_tokens += n
        STATE.verify_steps += 1
        STATE.last_gen_throughput = n / gap if gap > 0 else 0.0
        if first:
            STATE.ttft.observe(since_start)
        else:
            STATE.itl.observe(gap / n)
        if STATE.decode_steps % cfg.decode_log_interval == 0:
            decode_line(cfg)


def maybe_crash_on_first_request(cfg: Config) -> None:
    if FAIL != "ddtree-width":
        return
    with STATE.lock:
        if STATE.first_request_seen:
            return
        STATE.first_request_seen = True
    scheduler_crash(cfg, ddtree_width_traceback(cfg))


# ---------------------------------------------------------------- HTTP


def prompt_len(messages: Any) -> int:
    text = json.dumps(messages) if not isinstance(messages, str) else messages
    return max(1, len(text.split()))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        return  # access lines are written in uvicorn's format by respond()

    def log_access(self, status: int) -> None:
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        access_line(self.command, self.path, status, client)

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.log_access(status)

    def send_text(self, status: int, text: str, ctype: str = "text/plain") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.log_access(status)

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        routes = {
            "/health": self.health,
            "/health_generate": self.health_generate,
            "/v1/models": self.models,
            "/server_info": self.server_info,
            "/get_server_info": self.server_info,
            "/model_info": self.model_info,
            "/get_model_info": self.model_info,
            "/metrics": self.metrics,
        }
        routes.get(path, self.not_found)()

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        routes = {"/v1/chat/completions": self.chat, "/generate": self.generate}
        routes.get(path, self.not_found)()

    def not_found(self) -> None:
        self.send_json(404, {"detail": "Not Found"})

    def not_ready(self) -> bool:
        if STATE.ready:
            return False
        self.send_text(503, "")
        return True

    def health(self) -> None:
        self.send_text(200 if STATE.ready else 503, "")

    def health_generate(self) -> None:
        if self.not_ready():
            return
        "".join(generate(CFG, 1, 1))
        self.send_text(200, "")

    def models(self) -> None:
        self.send_json(200, {"object": "list", "data": [{
            "id": CFG.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": CFG.model_name, "max_model_len": CFG.context_len}]})

    def model_info(self) -> None:
        self.send_json(200, {"model_path": CFG.args.model_path, "tokenizer_path":
                             CFG.args.model_path, "is_generation": True})

    def server_info(self) -> None:
        state: dict[str, Any] = {"last_gen_throughput": STATE.last_gen_throughput,
                                 "memory_usage": {"weight": 74.34, "kvcache": 35.12,
                                                  "graph": 1.10}}
        if CFG.speculative:
            state["avg_spec_accept_length"] = STATE.avg_accept
        self.send_json(200, {**server_args_dict(CFG), "version": __version__,
                             "max_total_num_tokens": MAX_TOKENS_POOL,
                             "internal_states": [state]})

    def metrics(self) -> None:
        if not CFG.args.enable_metrics:
            self.not_found()
            return
        self.send_text(200, metrics_text(), "text/plain; version=0.0.4; charset=utf-8")

    def chat(self) -> None:
        if self.not_ready():
            return
        body = self.read_json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self.send_json(400, {"object": "error", "message": "messages is required",
                                 "type": "BadRequestError", "code": 400})
            return
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        pieces = generate(CFG, prompt_len(messages), max_tokens)
        rid = uuid.uuid4().hex
        if body.get("stream"):
            self.stream_chat(rid, pieces, prompt_len(messages))
            return
        text = "".join(pieces)
        self.send_json(200, {
            "id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": CFG.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_len(messages), "completion_tokens": max_tokens,
                      "total_tokens": prompt_len(messages) + max_tokens}})

    def stream_chat(self, rid: str, pieces: Iterator[str], prompt_tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.log_access(200)

        def chunk(delta: dict[str, Any], finish: str | None) -> None:
            event = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": CFG.model_name,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}]}
            self.write_chunk(f"data: {json.dumps(event)}\n\n")

        chunk({"role": "assistant", "content": ""}, None)
        for piece in pieces:
            chunk({"content": piece}, None)
        chunk({}, "length")
        self.write_chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def write_chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def generate(self) -> None:
        if self.not_ready():
            return
        body = self.read_json()
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_new_tokens") or 16)
        prompt = body.get("text") or body.get("input_ids") or ""
        start = time.perf_counter()
        text = "".join(generate(CFG, prompt_len(prompt), max_tokens))
        self.send_json(200, {"text": text, "meta_info": {
            "id": uuid.uuid4().hex, "prompt_tokens": prompt_len(prompt),
            "completion_tokens": max_tokens, "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": max_tokens},
            "e2e_latency": time.perf_counter() - start}})


def metrics_text() -> str:
    labels = f'model_name="{CFG.model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    gauges = {
        "num_running_reqs": ("The number of running requests.", STATE.running),
        "num_queue_reqs": ("The number of requests in the waiting queue.", STATE.queued),
        "num_used_tokens": ("The number of used tokens.", STATE.tokens_in_use),
        "token_usage": ("The token usage.", STATE.tokens_in_use / MAX_TOKENS_POOL),
        "gen_throughput": ("The generation throughput (token/s).", STATE.last_gen_throughput),
        "cache_hit_rate": ("The prefix cache hit rate.", 0.0),
        "spec_accept_length": ("The average acceptance length of speculative decoding.",
                               STATE.avg_accept if CFG.speculative else 0.0),
        "spec_accept_rate": ("The average acceptance rate of speculative decoding.",
                             (STATE.avg_accept - 1) / max(CFG.block - 1, 1)
                             if CFG.speculative and STATE.verify_steps else 0.0),
        "is_cuda_graph": ("Whether the batch is using CUDA graph.",
                          1.0 if cuda_graph_on(CFG) else 0.0),
        "weight_load_duration_seconds": ("Time spent loading model weights.",
                                         STATE.weight_load_s),
    }
    out: list[str] = []
    for name, (help_text, value) in gauges.items():
        out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} gauge",
                f"sglang:{name}{{{labels}}} {float(value)}"]
    for name, help_text, value in (
        ("prompt_tokens", "Number of prefill tokens processed.", STATE.prompt_tokens),
        ("generation_tokens", "Number of generation tokens processed.",
         STATE.generation_tokens),
        ("num_requests", "The number of processed requests.", STATE.num_requests),
    ):
        out += [f"# HELP sglang:{name}_total {help_text}", f"# TYPE sglang:{name}_total counter",
                f"sglang:{name}_total{{{labels}}} {float(value)}"]
    for name, help_text, hist in (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         STATE.ttft),
        ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         STATE.itl),
        ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
         STATE.e2e),
    ):
        out += histogram_lines(name, help_text, hist, labels)
    return "\n".join(out) + "\n"


def histogram_lines(name: str, help_text: str, hist: Histogram, labels: str) -> list[str]:
    out = [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} histogram"]
    for bound, count in zip(HIST_BUCKETS, hist.counts, strict=True):
        out.append(f'sglang:{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
    out.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(hist.n)}')
    out.append(f"sglang:{name}_sum{{{labels}}} {hist.total}")
    out.append(f"sglang:{name}_count{{{labels}}} {float(hist.n)}")
    return out


# ---------------------------------------------------------------- main


def on_sigterm(signum: int, frame: Any) -> None:
    """PID 1 in a container ignores SIGTERM unless handled: exit promptly like uvicorn does."""
    emit(sys.stderr, "INFO:     Shutting down\n")
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    global CFG
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    CFG = make_config(parse_args(sys.argv[1:] if argv is None else argv))
    server = ThreadingHTTPServer((CFG.args.host, CFG.args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start_up(CFG)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
