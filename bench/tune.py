"""Tune against a known optimum: does the recommendation pick the fastest lossless candidate
at each concurrency?

    python bench/tune.py                      # paced engines of known speed (seconds)
    python bench/tune.py --road panel [--database-url URL] [--redis-url URL] [--image TAG]

`--road paced` (the default): appliance.tune's run_tune, the code the panel's Tune task runs,
over paced engines (appliance/tune/paced.py) whose speed and acceptance per candidate are set
(below: a step's cost grows with the batch, more for a wider verify; acceptance as a DFlash
drafter's on chat prompts), so the optimum per concurrency is known beforehand
(`Pace.expected_throughput`); one candidate is lossy and fastest, and must never be picked.
SHORTCUT, said in the output: the engines are in-process servers the Deployer swaps, not
deployments.

`--road panel`: the production road. PostgreSQL and Redis, the Celery worker and the engine
agent as processes of this checkout (as compose runs them), the deployment's engines test
engine containers (docker/test-engine, the simulator: its acceptance and step cost per
algorithm, budget and concurrency are replayed from recordings of the real engine). A Tune
through the panel's service (tune_create; the worker runs it), then an exhaustive sweep: the
same candidates at the same levels with four times the requests (a second Tune, the
reference). Per level: Tune's pick, its tok/s in the sweep against the sweep's best (within
5 %), and Tune's total time. Exit 0 when every level's pick is within 5 % of the best.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TOLERANCE = 0.05


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--road", choices=("paced", "panel"), default="paced")
    p.add_argument("--levels", default="1,4,16", help="concurrency levels")
    p.add_argument("--requests", type=int, default=32, help="requests per level")
    p.add_argument("--output-len", type=int, default=24)
    p.add_argument("--database-url", default=os.environ.get(
        "APPLIANCE_DATABASE_URL", "postgres://appliance@127.0.0.1:5432/appliance_bench"))
    p.add_argument("--redis-url", default=os.environ.get("APPLIANCE_REDIS_URL",
                                                         "redis://127.0.0.1:6379/0"))
    p.add_argument("--image", default=os.environ.get("APPLIANCE_TEST_ENGINE_IMAGE",
                                                     "appliance-test-engine:latest"))
    p.add_argument("--json", action="store_true", help="the figures as JSON too")
    return p.parse_args()


def _verdict(picks: dict[int, str], truth: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """Per level: the pick, the best, and the pick's tok/s against the best's (truth: tok/s
    per candidate per level, lossless candidates only)."""
    rows = []
    for level, pick in sorted(picks.items()):
        known = truth.get(level, {})
        best = max(known, key=lambda n: known[n]) if known else None
        ratio = known[pick] / known[best] if best and pick in known and known[best] else None
        rows.append({"concurrency": level, "pick": pick, "best": best,
                     "pick_tok_s": known.get(pick), "best_tok_s": known.get(best or ""),
                     "ratio": ratio, "ok": ratio is not None and ratio >= 1 - TOLERANCE})
    return rows


def _print(rows: list[dict[str, Any]], seconds: float, note: str) -> bool:
    print(note)
    print(f"{'conc':>5} {'Tune picks':<12} {'known best':<12} {'pick tok/s':>11} "
          f"{'best tok/s':>11} {'ratio':>6}  ok")
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        pick_tps = "-" if r["pick_tok_s"] is None else f"{r['pick_tok_s']:.1f}"
        best_tps = "-" if r["best_tok_s"] is None else f"{r['best_tok_s']:.1f}"
        print(f"{r['concurrency']:>5} {r['pick'] or '-':<12} {r['best'] or '-':<12} "
              f"{pick_tps:>11} {best_tps:>11} {ratio:>6}  {'yes' if r['ok'] else 'NO'}")
    print(f"Tune's total time: {seconds:.1f} s")
    return all(r["ok"] for r in rows)


# ------------------------------------------------------------------ paced

def road_paced(args: argparse.Namespace, levels: tuple[int, ...]) -> int:
    from appliance.bench.prompts import Prompt
    from appliance.tune import BASELINE, TuneOptions, default_candidates, run_tune
    from appliance.tune.candidates import Candidate
    from appliance.tune.paced import Pace, PacedDeployer
    from tests.specs import spec

    # A step grows with the batch, more for a wider verify (DDTREE's budget+1 tokens per
    # request); acceptance grows with the budget. Steps of 10 ms and more, long beside the
    # event loop's own delay; the best at each level at least 10 % ahead of the next, so a
    # loaded machine's noise does not turn the order.
    paces = {BASELINE: Pace(0.010, 1.0, 0.02),
             "dflash": Pace(0.012, 2.4, 0.14, speculative=True),
             "ddtree-8": Pace(0.013, 2.9, 0.30, speculative=True),
             "ddtree-16": Pace(0.015, 4.4, 0.50, speculative=True),
             "ddtree-32": Pace(0.019, 3.6, 0.50, speculative=True),
             "lossy": Pace(0.010, 6.0, 0.0, speculative=True, lossy=True)}
    cands = [*default_candidates(spec()["engine"]),
             Candidate("lossy", {"speculative_algorithm": "DFLASH"})]
    deployer = PacedDeployer(paces, original="ddtree-32", processes=True)
    prompts = [Prompt(f"request {i}", 16, args.output_len) for i in range(args.requests)]
    try:
        result = run_tune(cands, deployer, prompts, [f"check {i}" for i in range(4)],
                          TuneOptions(levels=levels, warmup=1, time_budget_s=900))
    finally:
        deployer.close()
    effective = {c: min(c, args.requests) for c in levels}
    truth = {c: {n: p.expected_throughput(effective[c]) for n, p in paces.items()
                 if not p.lossy} for c in levels}
    picks = {e["concurrency"]: e["candidate"] for e in result.recommendation["per_level"]}
    rows = _verdict(picks, truth)
    ok = _print(rows, result.seconds, "road: paced engines, a process each (SHORTCUT: not "
                "deployments; the known optimum from their set speeds, "
                "Pace.expected_throughput)")
    lossy = next(c for c in result.candidates if c["name"] == "lossy")
    print(f"lossy candidate: lossless {lossy['lossless'].get('passed')}, picked "
          f"{'lossy' in picks.values()}; restore: {result.restore['message']}")
    ok = ok and "lossy" not in picks.values() and result.restore["ok"]
    if args.json:
        print(json.dumps({"rows": rows, "seconds": result.seconds, "result": result.to_dict()},
                         indent=1, default=str))
    return 0 if ok else 1


# ------------------------------------------------------------------ panel

def road_panel(args: argparse.Namespace, levels: tuple[int, ...]) -> int:
    import _loadkit

    from tests.models import write_models

    # The model folders the test specs name (/models/<name>), small and real, as the suite
    # makes them: pre-flight refuses a path with no checkpoint. Here and in the processes.
    roots = write_models(Path(tempfile.mkdtemp(prefix="tune-bench-models-")))
    os.environ["APPLIANCE_MODEL_ROOTS"] = str(roots)
    os.environ["APPLIANCE_ENGINE_TEST_ENV"] = "1"
    _loadkit.setup_django(args)
    import redis

    from tests.conftest_docker import remove_engines
    from tests.servers import celery_worker, engine_agent
    from tests.specs import spec
    from web.benchmarks import tune_services
    from web.benchmarks.tune_models import TuneRun
    from web.deploy import services as deploying
    from web.deployments.models import Deployment
    from web.deployments.services.installation import instance_id

    redis.Redis.from_url(args.redis_url).flushdb()
    env = {"APPLIANCE_REDIS_URL": args.redis_url, "APPLIANCE_DEBUG": "0",
           "APPLIANCE_ENGINE_IMAGE": args.image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.005,TEST_ENGINE_SHARDS=2",
           "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5", "APPLIANCE_ENGINE_TEST_ENV": "1"}
    from django.conf import settings

    settings.ENGINE_GPU_REQUESTS = False
    logs = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    config = {"levels": list(levels), "num_prompts": args.requests,
              "output_len": args.output_len, "prompt_source": "builtin", "warmup": 2,
              "time_budget_s": 3600, "deploy_timeout_s": 300, "lossless_prompts": 4,
              "lossless_max_tokens": 16}

    def tune(pk: int, requests: int) -> TuneRun:
        run = tune_services.tune_create(deployment_id=pk, config={**config,
                                                                  "num_prompts": requests})
        deadline = time.monotonic() + 3600
        while TuneRun.objects.get(pk=run.pk).is_active:
            if time.monotonic() > deadline:
                raise SystemExit(f"tune #{run.pk} did not end in an hour")
            time.sleep(1)
        run = TuneRun.objects.get(pk=run.pk)
        if run.status != "done":
            raise SystemExit(f"tune #{run.pk} {run.status}: {run.error[-2000:]}")
        return run

    Deployment.objects.filter(name="tune-bench").delete()
    with celery_worker(logs / "worker.log", **env), engine_agent(logs / "agent.log", **env):
        try:
            row = deploying.deployment_create(data=spec(name="tune-bench", self_check=False),
                                              confirm_warnings=True)
            deadline = time.monotonic() + 300
            while Deployment.objects.get(pk=row.pk).status != "ready":
                if time.monotonic() > deadline:
                    raise SystemExit("the deployment was not ready in 300 s")
                time.sleep(0.5)
            quick = tune(row.pk, args.requests)
            sweep = tune(row.pk, args.requests * 4)
        finally:
            remove_engines(instance_id())
    lossless = {c["name"] for c in sweep.results["candidates"]
                if c["name"] == "none" or (c.get("lossless") or {}).get("passed")}
    truth: dict[int, dict[str, float]] = {}
    for r in sweep.results["rows"]:
        if r["candidate"] in lossless:
            truth.setdefault(r["concurrency"], {})[r["candidate"]] = r["output_throughput"]
    picks = {e["concurrency"]: e["candidate"]
             for e in quick.results["recommendation"]["per_level"]}
    rows = _verdict(picks, truth)
    ok = _print(rows, quick.results["seconds"], "road: the panel's Tune (worker, agent, test "
                "engine containers: the SIMULATOR); the best from an exhaustive sweep of the "
                f"same candidates with {args.requests * 4} requests a level")
    print(f"crossover: {quick.results['recommendation']['crossover']}; "
          f"{quick.results['recommendation']['summary']}")
    if args.json:
        print(json.dumps({"rows": rows, "quick": quick.results, "sweep": sweep.results},
                         indent=1, default=str))
    return 0 if ok else 1


def main() -> int:
    args = parse_args()
    levels = tuple(sorted({int(x) for x in args.levels.split(",") if x.strip()}))
    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    return road_paced(args, levels) if args.road == "paced" else road_panel(args, levels)


if __name__ == "__main__":
    sys.exit(main())
