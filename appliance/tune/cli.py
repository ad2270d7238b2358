"""`appliance tune`: run Tune on a deployment through the panel's REST API, follow it, print
the recommendation; Ctrl-C cancels it (the panel restores the deployment). An operator's API
token (`manage.py apitoken`, or the Account page) in --token or $APPLIANCE_TOKEN.

Exit codes: 0 the Tune finished (and was applied, with --apply), 1 it failed, was cancelled
or its Apply failed, 2 bad input (the panel's 400, naming the field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TOKEN_ENV, PANEL_ENV = "APPLIANCE_TOKEN", "APPLIANCE_PANEL_URL"
POLL_S = 2.0
HTTP_TIMEOUT_S = 30.0


class PanelError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {json.dumps(body)[:1000]}")
        self.status, self.body = status, body


def _call(panel: str, token: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(panel.rstrip("/") + path, data=data, method=method,
                                     headers={"Authorization": f"Token {token}",
                                              "Content-Type": "application/json",
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            found = json.loads(raw)
        except json.JSONDecodeError:
            found = raw.decode(errors="replace")[:500]
        raise PanelError(exc.code, found) from None


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cmd = sub.add_parser("tune", help="find the fastest lossless speculation for a deployment "
                         "(through the panel); Ctrl-C cancels and restores it")
    cmd.add_argument("deployment", type=int, help="the deployment's id (ready; with replicas, "
                     "replica 0's)")
    cmd.add_argument("--panel", default=os.environ.get(PANEL_ENV, "http://127.0.0.1:8000"),
                     help=f"the panel's URL (default ${PANEL_ENV}, else http://127.0.0.1:8000)")
    cmd.add_argument("--token", default="", help=f"an operator's API token (default "
                     f"${TOKEN_ENV})")
    cmd.add_argument("--levels", default="1,8,32", help="concurrency levels, e.g. 1,8,32")
    cmd.add_argument("--candidates", default="", help="default candidates to run, comma-"
                     "separated (none, dflash, ddtree-8, ddtree-16, ddtree-32; default all)")
    cmd.add_argument("--extra", default="", help='more candidates as JSON: [{"name": '
                     '"dflash-bs16", "engine": {"speculative_num_draft_tokens": 16}}]')
    cmd.add_argument("--prompts", type=Path, help="JSONL or ShareGPT prompts file (default: "
                     "the built-in set)")
    cmd.add_argument("--prompt-format", choices=("jsonl", "sharegpt"), default="jsonl")
    cmd.add_argument("--num-prompts", type=int, default=32, help="requests per level")
    cmd.add_argument("--output-len", type=int, default=128)
    cmd.add_argument("--time-budget", type=int, default=3600, help="seconds for the whole "
                     "Tune; spent, it stops and the deployment is restored")
    cmd.add_argument("--side-by-side", action="store_true", help="run the candidates on "
                     "free GPUs of the same kind while the deployment serves on (default: "
                     "in place, on its own GPUs, out of service meanwhile)")
    cmd.add_argument("--apply", action="store_true", help="apply the recommendation at the "
                     "end (a rolling redeploy where the deployment has replicas)")
    cmd.add_argument("--text", action="store_true", help="human-readable text, not JSON")
    cmd.set_defaults(func=cmd_tune)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "levels": [int(x) for x in args.levels.split(",") if x.strip()],
        "num_prompts": args.num_prompts, "output_len": args.output_len,
        "time_budget_s": args.time_budget,
        "placement": "side_by_side" if args.side_by_side else "in_place",
        "candidates": [c.strip() for c in args.candidates.split(",") if c.strip()]}
    if args.extra:
        body["extra_candidates"] = json.loads(args.extra)
    if args.prompts:
        body["prompt_source"] = args.prompt_format
        body["prompts"] = args.prompts.read_text(encoding="utf-8")
    return body


def _line(run: dict[str, Any]) -> str:
    p = run.get("progress") or {}
    if not p.get("candidate"):
        return f"tune #{run['id']}: {run['status']}"
    level = f" at concurrency {p['level']}" if p.get("phase") == "benchmark" and p.get(
        "level") else ""
    return (f"tune #{run['id']}: candidate {p['index']}/{p['count']} {p['candidate']}, "
            f"{p['phase']}{level}; {round(p.get('time_left_s', 0))} s left")


def print_text(run: dict[str, Any]) -> None:
    results = run.get("results") or {}
    if results.get("simulator"):
        print("SIMULATOR: these figures come from the test engine, not SGLang")
    print(f"{'candidate':<14} {'state':<9} {'lossless':<10} {'conc':>5} {'tok/s':>9} "
          f"{'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} {'accept':>6}")
    for c in results.get("candidates", []):
        lossless = c.get("lossless") or {}
        word = ("baseline" if lossless.get("baseline") else "passed" if lossless.get(
            "passed") else "FAILED" if lossless.get("passed") is False else "-")
        rows = [r for r in results.get("rows", []) if r["candidate"] == c["name"]]
        if not rows:
            why = " ".join(c.get("findings") or []) or c.get("error") or ""
            print(f"{c['name']:<14} {c['state']:<9} {word:<10} {why[:80]}")
        for r in rows:
            accept = r.get("request_accept_len") or r.get("accept_len")
            print(f"{c['name']:<14} {c['state']:<9} {word:<10} {r['concurrency']:>5} "
                  f"{r['output_throughput']:>9.1f} "
                  f"{r['ttft_ms']['p50']:>8.1f}/{r['ttft_ms']['p99']:<8.1f} "
                  f"{r['tpot_ms']['p50']:>8.2f}/{r['tpot_ms']['p99']:<8.2f} "
                  f"{accept if accept is None else round(accept, 2)!s:>6}")
    rec = results.get("recommendation") or {}
    print(rec.get("summary", ""))
    if results.get("restore"):
        print(f"restore: {results['restore']['message']}")
    if run.get("error"):
        print(f"ended: {run['error'].strip().splitlines()[-1]}")


def cmd_tune(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"error  give an operator's API token with --token or ${TOKEN_ENV}",
              file=sys.stderr)
        return 2
    try:
        body = _body(args)
    except (ValueError, OSError) as exc:
        print(f"error  {exc}", file=sys.stderr)
        return 2
    try:
        run = _call(args.panel, token, "POST", f"/api/deployments/{args.deployment}/tune/",
                    body)
    except PanelError as exc:
        print(f"error  {exc}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as exc:
        print(f"error  cannot reach the panel at {args.panel}: {exc}", file=sys.stderr)
        return 2
    run = _follow(args, token, run)
    if args.apply and run["status"] == "done":
        run = _apply(args, token, run)
    if args.text:
        print_text(run)
    else:
        print(json.dumps(run, indent=2))
    applied = (run.get("applied") or {}).get("state")
    ok = run["status"] == "done" and (not args.apply or applied in ("done", "rolling"))
    return 0 if ok else 1


def _follow(args: argparse.Namespace, token: str, run: dict[str, Any]) -> dict[str, Any]:
    said = ""
    cancelled = False
    while run["status"] in ("queued", "running", "cancelling"):
        try:
            time.sleep(POLL_S)
            run = _call(args.panel, token, "GET", f"/api/tunes/{run['id']}/")
        except KeyboardInterrupt:
            if cancelled:
                raise
            cancelled = True
            print("cancelling: the panel restores the deployment (Ctrl-C again to leave it "
                  "to the panel)", file=sys.stderr)
            run = _call(args.panel, token, "POST", f"/api/tunes/{run['id']}/cancel/", {})
        line = _line(run)
        if line != said:
            print(line, file=sys.stderr)
            said = line
    return run


def _apply(args: argparse.Namespace, token: str, run: dict[str, Any]) -> dict[str, Any]:
    run = _call(args.panel, token, "POST", f"/api/tunes/{run['id']}/apply/", {})
    while (run.get("applied") or {}).get("state") in ("queued", "running"):
        time.sleep(POLL_S)
        run = _call(args.panel, token, "GET", f"/api/tunes/{run['id']}/")
    print(f"apply: {run['applied'].get('state')} {run['applied'].get('message', '')}",
          file=sys.stderr)
    return run
