"""SGLang's log line formats ("new" 0.5.23 and "old" pre-0.5.12) for each phase."""

from __future__ import annotations

import sys

from sglang.test_engine.config import Config
from sglang.test_engine.engine import MAX_TOKENS_POOL, STATE
from sglang.test_engine.output import log, uvicorn_line
from sglang.test_engine.settings import FAIL, QUANT, STYLE


def load_end_line(model_type: str, elapsed: float, usage: float) -> str:
    avail = 137.52 - usage
    if STYLE == "old":
        return (f"Load weight end. type={model_type}, dtype=torch.bfloat16, "
                f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.")
    # SGLang names the quantization only for a quantized checkpoint (model_config's
    # get_quantization_config_log_str); the recorded tiny model has none.
    quant = f"quant={QUANT}, " if QUANT and model_type != "DFlashDraftModel" else ""
    return (f"Load weight end. elapsed={elapsed:.2f} s, type={model_type}, {quant}"
            f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.")


def kv_cache_line(role: str = "target") -> str:
    if STYLE == "old":
        return f"KV Cache is allocated. #tokens: {MAX_TOKENS_POOL}, KV size: 35.12 GB"
    if role == "draft":  # the drafter's pool is an MHA one: K and V apart (433c58ed7)
        return (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {MAX_TOKENS_POOL}, "
                "K size: 1.12 GB, V size: 1.12 GB")
    return (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {MAX_TOKENS_POOL}, "
            "KV size: 35.12 GB")


def memory_pool_end_line(avail: float) -> str:
    return f"Memory pool end. avail mem={avail:.2f} GB"


def capture_begin_line(cfg: Config, role: str, kind: str, per_req: int) -> str:
    if STYLE == "old":
        what = "draft cuda graph" if role == "draft" else "cuda graph"
        return f"Capture {what} begin. This can take up to several minutes. avail mem=20.11 GB"
    return (f"Capture {role} {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={per_req}, bs={cfg.capture_bs}, avail mem=20.11 GB")


def capture_end_line(cfg: Config, role: str, kind: str, avail: float) -> str:
    usage = 20.11 - avail
    elapsed = 1.20 * len(cfg.capture_bs)
    if STYLE == "old":
        what = "draft cuda graph" if role == "draft" else "cuda graph"
        return (f"Capture {what} end. Time elapsed: {elapsed:.2f} s. "
                f"mem usage={usage:.2f} GB. avail mem={avail:.2f} GB.")
    return (f"Capture {role} {kind} CUDA graph end. "
            f"elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.")


def access_line(method: str, path: str, status: int, client: str = "127.0.0.1:41234") -> None:
    """uvicorn's access log: its own handler on stdout. Before uvicorn's startup lines the
    real engine has no HTTP server at all (the recordings show no request before them), so
    the stand-in, which answers 503 from the start, logs none of those requests."""
    if not STATE.http_up:
        return
    phrase = {200: "OK", 404: "Not Found", 503: "Service Unavailable", 400: "Bad Request"}
    uvicorn_line(sys.stdout, f'{client} - "{method} {path} HTTP/1.1" {status} '
                             f'{phrase.get(status, "")}')


def prefill_line(new_tokens: int, cached_tokens: int, running: int) -> None:
    usage = STATE.tokens_in_use / MAX_TOKENS_POOL
    msg = (f"Prefill batch, #new-seq: 1, #new-token: {new_tokens}, "
           f"#cached-token: {cached_tokens}, token usage: {usage:.2f}, "
           f"#running-req: {running}, #queue-req: {STATE.queued}, ")
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
