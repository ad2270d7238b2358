"""The launch flags and the Config derived from them (like SGLang's ServerArgs)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from sglang.test_engine.settings import env_float


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
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--decode-log-interval", type=int, default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", dest="api_key", default=None)
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


def server_args_dict(cfg: Config) -> dict[str, Any]:
    """The fields the test engine knows, in the order 433c58ed7's ServerArgs prints them
    (tests/testengine/test_test_engine_shapes.py holds the order against the recordings)."""
    a = cfg.args
    return {
        "model_path": a.model_path,
        "trust_remote_code": a.trust_remote_code,
        "context_length": a.context_length,
        "mem_fraction_static": a.mem_fraction_static or 0.88,
        "max_running_requests": cfg.max_running,
        "tp_size": a.tp_size,
        "dp_size": a.dp_size,
        "host": a.host,
        "port": a.port,
        "api_key": a.api_key,
        "served_model_name": cfg.model_name,
        "enable_metrics": a.enable_metrics,
        "decode_log_interval": cfg.decode_log_interval,
        "attention_backend": a.attention_backend,
        "cuda_graph_max_bs_decode": max(cfg.capture_bs),
        "disable_cuda_graph": a.disable_cuda_graph,
        "speculative_algorithm": None if cfg.algo == "NONE" else cfg.algo,
        "speculative_draft_model_path": a.speculative_draft_model_path,
        "speculative_num_draft_tokens": cfg.block if cfg.speculative else None,
        "speculative_ddtree_budget": cfg.budget if cfg.algo == "DDTREE" else None,
    }
