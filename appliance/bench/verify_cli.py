"""`appliance verify`'s command line: its arguments, its text report and its exit status
(0: every prompt matched or parted at a near-tie; 1: a divergence at a clear margin; 2: bad
input or a server that could not be asked). The comparison is appliance/bench/verify.py's."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from appliance.bench.lossless import NEAR_TIE_GAP
from appliance.bench.prompts import PromptError, from_jsonl
from appliance.bench.verify import API_KEY_ENV, Side, VerifyResult, shipped_prompts, verify
from appliance.bench.verify_api import APIS, ENDPOINTS, PATHS, VerifyError


def check_url(url: str, flag: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise VerifyError(f"{flag}: {url!r} is not an http(s) URL; give the server's base "
                          "URL, e.g. http://127.0.0.1:30000")
    return url.rstrip("/")


def prompts_from_jsonl(path: Path) -> list[str]:
    """The bench's prompt file format (appliance.bench.prompts.from_jsonl): one
    {"prompt": "..."} or a bare JSON string per line; blank lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerifyError(f"--prompts: cannot read {path}: {exc}") from exc
    try:
        prompts = [p.text for p in from_jsonl(text, output_len=1)]
    except PromptError as exc:
        raise VerifyError(f'--prompts: {path} {exc}; write one {{"prompt": "..."}} per '
                          "line") from exc
    if not prompts:
        raise VerifyError(f"--prompts: {path} holds no prompt")
    return prompts


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cmd = sub.add_parser("verify", help="check a speculative server (A) gives its baseline's "
                         "(B) tokens at temperature 0; exit 1 on a divergence at a clear margin")
    cmd.add_argument("--a", required=True, help="the speculative server's base URL (an "
                     "engine's, or the gateway's: the panel's URL, without /v1)")
    cmd.add_argument("--b", required=True, help="the baseline's base URL (no speculation: it "
                     "must give log-probs)")
    cmd.add_argument("--api", choices=APIS, default="auto", help="sglang: SGLang's /generate "
                     "(token ids compared); openai: /v1 (token texts compared); auto (the "
                     "default): sglang where both servers answer SGLang's /model_info and no "
                     "model is named, else openai")
    cmd.add_argument("--endpoint", choices=ENDPOINTS, default="completions",
                     help="with openai: /v1/completions (the default) or /v1/chat/completions "
                     "(each prompt as one user message)")
    cmd.add_argument("--model", default="", help="with openai: the request's model on both "
                     "servers (default: the one /v1/models lists); through the gateway, the "
                     "deployment's served model name")
    cmd.add_argument("--a-model", default="", help="A's model, where it differs from B's "
                     "(two deployments behind one gateway)")
    cmd.add_argument("--b-model", default="", help="B's model")
    cmd.add_argument("--a-algorithm", default="", help="A's speculative algorithm (DFLASH, "
                     "DDTREE): the refusal table (appliance/engine/refusals.py) then decides "
                     "whether A is asked for log-probs, for the build --a-build names (none: "
                     "the most a recorded build refused); without it A is asked until it "
                     "first refuses")
    cmd.add_argument("--a-build", default="", help="A's engine build, as recipes key it: a "
                     "release (0.5.23) or a commit's first 9 hex digits (433c58ed7): the "
                     "recipe's sglang pip release, or its ref's first 9")
    cmd.add_argument("--api-key", default="", help="sent as 'Authorization: Bearer KEY' to "
                     f"both (default: ${API_KEY_ENV}); the gateway's keys are sk-sd-...")
    cmd.add_argument("--prompts", type=Path, help='JSONL, one {"prompt": "..."} per line '
                     "(default: the built-in set, appliance/bench/data/lossless-prompts.jsonl)")
    cmd.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    cmd.add_argument("--threshold", type=float, default=NEAR_TIE_GAP,
                     help="top-2 log-prob gap at or under which a divergence is a near-tie "
                     f"(default {NEAR_TIE_GAP}: 4x the largest measured on the real engine)")
    cmd.add_argument("--json", action="store_true", help="the whole result as JSON")
    cmd.set_defaults(func=cmd_verify)


def _side(side: Side | None, api: str) -> str:
    if side is None:
        return "-"
    text = "" if side.text is None else f"  text {json.dumps(side.text[:60])}"
    if api == "sglang":
        return f"ids {side.ids}{text}"
    return f"tokens {json.dumps(side.ids, ensure_ascii=False)}{text}"


def print_text(result: VerifyResult) -> None:
    if result.api != "sglang":
        print(f"OpenAI {PATHS[result.api]}, A model {result.models.get('a')!r}, B model "
              f"{result.models.get('b')!r}; compared: {result.compared}")
    for note in result.notes:
        print(f"note: {note}")
    if result.a_logprobs != "given":
        print(f"A gives no log-probs ({result.a_logprobs}); B's log-probs judge each divergence")
    for p in result.prompts:
        head = f"{p.index:>3} {p.verdict:<9}"
        if p.position is None:
            print(f"{head} {p.prompt[:60]!r}")
            continue
        gap = "-" if p.gap is None else f"{p.gap:.4f}"
        if p.verdict == "not-greedy":
            below = ("outside its top log-probs" if p.baseline_gap is None
                     else f"{p.baseline_gap:.4f} below its top-1")
            print(f"{head} at token {p.position}, B is not greedy at that token: its own "
                  f"token is {below}, so B's log-probs cannot judge A there; give a greedy "
                  f"baseline as --b (temperature 0, no sampling): {p.prompt[:60]!r}")
        else:
            print(f"{head} at token {p.position}, B's top-2 gap {gap}: {p.prompt[:60]!r}")
        print(f"      A: {_side(p.a, result.api)}\n      B: {_side(p.b, result.api)}")
        if p.a is not None and p.a.text_from == "character":
            print("      (text from the first character the two texts differ at)")
    total = len(result.prompts)
    print(f"match rate {result.identical}/{total}, near-ties {result.near_ties}, failures "
          f"{result.failures} (threshold {result.threshold})")


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        a_url, b_url = check_url(args.a, "--a"), check_url(args.b, "--b")
        if args.max_tokens < 1:
            raise VerifyError("--max-tokens must be a positive integer")
        if args.threshold < 0:
            raise VerifyError("--threshold must be 0 or more")
        prompts = prompts_from_jsonl(args.prompts) if args.prompts else shipped_prompts()
        result = asyncio.run(verify(
            a_url=a_url, b_url=b_url, prompts=prompts, max_tokens=args.max_tokens,
            threshold=args.threshold, api=args.api, endpoint=args.endpoint,
            api_key=args.api_key or os.environ.get(API_KEY_ENV, ""),
            a_model=args.a_model or args.model, b_model=args.b_model or args.model,
            a_build=args.a_build or None, a_algorithm=args.a_algorithm))
    except VerifyError as exc:
        print(f"error  {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_text(result)
    return 0 if result.passed else 1
