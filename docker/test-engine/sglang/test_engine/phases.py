"""The startup sequence (server args, load, KV cache, capture, ready) and its failure modes."""

from __future__ import annotations

import os
import sys
import time

from sglang.test_engine.config import Config, server_args_dict
from sglang.test_engine.engine import MAX_TOKENS_POOL, STATE
from sglang.test_engine.generation import start_traffic
from sglang.test_engine.loglines import (
    access_line,
    capture_begin_line,
    capture_end_line,
    kv_cache_line,
    load_end_line,
    memory_pool_end_line,
    prefill_line,
)
from sglang.test_engine.output import Bar, log, log_ranks, uvicorn_line
from sglang.test_engine.settings import (
    DRAFTER_BLOCK_SIZE,
    FAIL,
    PACE_S,
    SHARDS,
    STALL_S,
    STYLE,
)
from sglang.test_engine.tracebacks import (
    capture_oom_traceback,
    load_exit_traceback,
    scheduler_crash,
)


def print_server_args(cfg: Config) -> None:
    inner = ", ".join(f"{k}={v!r}" for k, v in server_args_dict(cfg).items())
    log(f"server_args=ServerArgs({inner})")


def load_weights(cfg: Config, role: str) -> None:
    """Load weight begin (every rank), shard progress (rank 0), Load weight end (every rank)."""
    log_ranks(cfg, lambda r: f"Load weight begin. avail mem={137.52 - 0.01 * r:.2f} GB")
    shards = SHARDS if role == "target" else 1
    # 433c58ed7 loads with its multi-thread iterator by default (enable_multithread_load).
    desc = ("Loading safetensors checkpoint shards" if STYLE == "old"
            else "Multi-thread loading shards")
    bar = Bar(shards, desc, sglang_format=True)
    started = time.monotonic()
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
    # The time this load took, as SGLang prints its own: the Weights card's figures (its
    # time and read rate) then agree with the run's, rather than claim a load it never did.
    STATE.weight_load_s = time.monotonic() - started
    model_type = "DFlashDraftModel" if role == "draft" else os.environ.get(
        "TEST_ENGINE_MODEL_TYPE", "DeepseekV3ForCausalLM")
    usage = 74.34 if role == "target" else 1.87
    log_ranks(cfg, lambda r: load_end_line(model_type, STATE.weight_load_s, usage))


def capture_width(cfg: Config, role: str) -> int:
    """Tokens per request each role's graph is captured for, as the pinned DDTree source does
    (target verify budget+1, draft the block). TEST_ENGINE_FAIL=ddtree-width is the bug this
    product exists for (the PR head): both roles at the block size."""
    if not cfg.speculative:
        return 1
    if role == "draft" or FAIL == "ddtree-width":
        return cfg.block
    return cfg.verify_width


def capture(cfg: Config, role: str) -> None:
    """One CUDA-graph capture: begin (every rank), per-bs progress (rank 0), end."""
    if cfg.args.disable_cuda_graph:
        return
    kind = "verify" if cfg.speculative else "decode"
    per_req = capture_width(cfg, role)
    log_ranks(cfg, lambda r: capture_begin_line(cfg, role, kind, per_req))
    bar = Bar(len(cfg.capture_bs))
    avail = 20.11
    for i, bs in enumerate(reversed(cfg.capture_bs)):
        bar.set_description(f"Capturing batches (bs={bs} avail_mem={avail:.2f} GB)")
        time.sleep(PACE_S)
        if FAIL == "capture-stall" and role == "target" and i == 1:
            time.sleep(STALL_S)  # quiet, as a hung NCCL or a stuck kernel is
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


def start_up(cfg: Config) -> None:
    """SGLang 433c58ed7's order (tests/fixtures/real-engine): both models' weights, then
    the target's KV pool and the drafter's, then the target's graphs and the drafter's."""
    print_server_args(cfg)
    load_weights(cfg, "target")
    if STYLE == "old":  # the older generation loads the drafter after the target's graphs
        log_ranks(cfg, lambda r: kv_cache_line())
        capture(cfg, "target")
        if cfg.speculative:
            load_weights(cfg, "draft")
            capture(cfg, "draft")
    else:
        if cfg.speculative:
            load_weights(cfg, "draft")
            drafter_block_size_check(cfg)
        log_ranks(cfg, lambda r: kv_cache_line())
        log_ranks(cfg, lambda r: memory_pool_end_line(63.08))
        if cfg.speculative:
            log_ranks(cfg, lambda r: kv_cache_line("draft"))
            log_ranks(cfg, lambda r: memory_pool_end_line(20.11))
        capture(cfg, "target")
        if cfg.speculative:
            capture(cfg, "draft")
    log(f"max_total_num_tokens={MAX_TOKENS_POOL}, chunked_prefill_size=8192, "
        f"max_prefill_tokens=16384, max_running_requests={cfg.max_running}, "
        f"context_len={cfg.context_len}, available_gpu_mem=18.62 GB", 0)
    for line in ("Started server process [1]", "Waiting for application startup.",
                 "Application startup complete.",
                 f"Uvicorn running on http://{cfg.args.host}:{cfg.args.port} "
                 "(Press CTRL+C to quit)"):
        uvicorn_line(sys.stderr, line)
    STATE.http_up = True
    warm_up(cfg)
    STATE.ready_at = time.time()
    STATE.ready = True
    log("The server is fired up and ready to roll!")
    start_traffic(cfg)


def drafter_block_size_check(cfg: Config) -> None:
    """433c58ed7's DFlashWorkerV2 (DDTree's too) after the drafter's load, on every rank
    (speculative/dflash_worker_v2.py): a drafter config of another block size is warned of,
    and the engine runs speculative_num_draft_tokens."""
    if DRAFTER_BLOCK_SIZE and cfg.block != DRAFTER_BLOCK_SIZE:
        log_ranks(cfg, lambda r: "DFLASH block size mismatch: using speculative_num_draft_tokens="
                  f"{cfg.block} but draft config block_size={DRAFTER_BLOCK_SIZE}.")


def warm_up(cfg: Config) -> None:
    """SGLang's warmup: GET /model_info then a short POST /generate (prefill only here)."""
    access_line("GET", "/model_info", 200)
    prefill_line(6, 0, 0)
    access_line("POST", "/generate", 200)
