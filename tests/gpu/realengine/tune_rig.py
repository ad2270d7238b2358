"""Tune on the GPU host: appliance.tune's own `run_tune` (the code the panel's Tune task runs)
drives the rig's SGLang engines on the trained pair, then an exhaustive sweep of the same
candidates at the same levels (the rig's bench: `appliance bench`, twice the requests) says
how close Tune's pick came to the best.

    python3 tests/gpu/realengine/tune_rig.py OUTDIR --models DIR   (the `tune` phase)
    python3 tests/gpu/realengine/tune_rig.py OUTDIR --fake         (paced engines, any host)

The Deployer here (RigDeployer) has no deployment to take over: the host has one GPU and no
Docker, and starting each candidate's engine in turn (about a minute each with its CUDA graphs)
would not fit the call, so every candidate's engine is started at once on the one GPU before
Tune begins (each on its own port, KV pool capped, as the `trained` phase does), and `deploy`
hands Tune the candidate's engine once it serves. Tune's time is therefore its checks and
measurements without the engines' starts; `engines.ready_s` in tune.json gives those. A
candidate is served alone: the others are up but idle while it is measured.

Each candidate's engine is launched from the candidate's own engine options (appliance.tune's
`default_candidates` of the trained DFLASH spec) laid over the trained runs' spec, through the
product's argv (substitutions.launch): the argv equals the `trained_*` runs' but for the port.

Writes OUTDIR/tune.json (Tune's result as the panel keeps it, its seconds, the engines' start)
and OUTDIR/sweep.json (each candidate at each level, and per level Tune's pick against the
sweep's best of all candidates and of those Tune found lossless). `--fake` stands paced
engines (appliance.tune.paced, a process each) in for SGLang, to try the whole road on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from runs import RUNS, TRAINED, TRAINED_ARGV, TRAINED_BENCH  # noqa: E402

from appliance.bench.prompts import load_prompts  # noqa: E402
from appliance.tune import (  # noqa: E402
    BASELINE,
    Candidate,
    DeployFailed,
    TuneOptions,
    TuneProgress,
    default_candidates,
    run_tune,
)

LEVELS = (1, 4, 16)
# Within this share of the sweep's best, Tune's pick counts as found.
TOLERANCE = 0.05
# The panel's defaults for the losslessness check (web/benchmarks/tune_services.py).
LOSSLESS_PROMPTS = 8
LOSSLESS_MAX_TOKENS = 32
BASE_PORT = 30100
# Paced stand-ins for --fake (speed and acceptance set, so that the pick changes with the
# concurrency as the trained pair's did: DFLASH at 1, no speculation from 4 on).
FAKE_PACES = {BASELINE: (0.004, 1.0, 0.05), "dflash": (0.0045, 3.2, 0.45),
              "ddtree-8": (0.006, 3.4, 0.9), "ddtree-16": (0.007, 3.8, 1.2),
              "ddtree-32": (0.009, 4.0, 1.6)}


def trained_engine(models: str) -> dict[str, Any]:
    """The trained DFLASH run's engine options as the product resolves them (the example spec
    with the trained runs' changes): what Tune's candidates are variants of."""
    from substitutions import _spec

    spec, _ = _spec("dflash", models, dict(TRAINED))
    return dict(spec.engine.model_dump() if hasattr(spec.engine, "model_dump")
                else vars(spec.engine))


def candidate_launch(candidate: Candidate, models: str, port: int) -> Any:
    """The candidate's engine: its own options over the trained runs' spec, the product's argv
    with the trained runs' changes (triton, no prefill graph, KV pool capped)."""
    from substitutions import launch

    overrides: dict[str, object] = dict(TRAINED)
    overrides.update({f"engine.{key}": value for key, value in candidate.engine.items()})
    example = "dflash" if candidate.algorithm == "DFLASH" else "ddtree"
    return launch(example, models, spec_overrides=overrides,
                  argv_overrides={**TRAINED_ARGV, "--port": str(port)})


class RigDeployer:
    """appliance.tune's Deployer over engines started together before Tune (see the module's
    text): `deploy` waits for the candidate's engine to serve and gives its URL."""

    def __init__(self, candidates: list[Candidate], models: str, folder: Path, *,
                 fake: bool, pythonpath: str = "") -> None:
        self.candidates, self.models, self.folder, self.fake = candidates, models, folder, fake
        self.pythonpath = pythonpath
        self.engines: dict[str, Any] = {}
        self.urls: dict[str, str] = {}
        self.ready_s: dict[str, float | None] = {}
        self.argv: dict[str, list[str]] = {}
        self.started = 0.0

    def start_all(self, timeout: float) -> dict[str, Any]:
        self.started = time.time()
        if self.fake:
            from appliance.tune.paced import Pace, PacedProcess

            for c in self.candidates:
                step, accept, slope = FAKE_PACES[c.name]
                engine = PacedProcess(Pace(step, accept, slope, speculative=c.speculative),
                                      c.name)
                self.urls[c.name] = engine.start()
                self.engines[c.name] = engine
                self.ready_s[c.name] = round(time.time() - self.started, 1)
            return self.summary()
        from record import READY, Engine

        for index, c in enumerate(self.candidates):
            port = BASE_PORT + 10 * index
            plan = candidate_launch(c, self.models, port)
            self.argv[c.name] = plan.argv
            env = {**os.environ, **plan.env, "PYTHONPATH": self.pythonpath,
                   "PYTHONUNBUFFERED": "1"}
            where = self.folder / "engines" / c.name
            where.mkdir(parents=True, exist_ok=True)
            self.engines[c.name] = Engine(plan, env, where)
            self.urls[c.name] = f"http://127.0.0.1:{port}"
            time.sleep(2)  # a little apart: each engine's first look at free memory
        end = self.started + timeout
        while time.time() < end:
            for name, engine in self.engines.items():
                if name not in self.ready_s and engine.seen(READY):
                    self.ready_s[name] = round(time.time() - engine.started, 1)
            if len(self.ready_s) == len(self.engines) or all(
                    name in self.ready_s or engine.proc.poll() is not None
                    for name, engine in self.engines.items()):
                break
            time.sleep(0.5)
        for name in self.engines:
            self.ready_s.setdefault(name, None)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {"ready_s": dict(self.ready_s), "all_ready_s": round(time.time() - self.started, 1),
                "fake": self.fake, "argv": self.argv}

    # -- appliance.tune.Deployer
    def preflight(self, candidate: Candidate) -> list[str]:
        return []

    def deploy(self, candidate: Candidate, stop: Any) -> str:
        # An engine still starting is waited for, up to the rig's deadline less the sweep's
        # share: the start's bound is for starting all at once, and one engine may come up
        # seconds after it (the no-speculation engine did, 0.1 s late, in one call).
        engine = self.engines.get(candidate.name)
        if not self.fake and engine is not None:
            from record import READY

            end = float(os.environ.get("RIG_DEADLINE", time.time())) - 60
            while (self.ready_s.get(candidate.name) is None and engine.proc.poll() is None
                   and time.time() < end and not stop()):
                if engine.seen(READY):
                    self.ready_s[candidate.name] = round(time.time() - engine.started, 1)
                    break
                time.sleep(0.5)
        if self.ready_s.get(candidate.name) is None:
            tail = "\n".join(getattr(engine, "lines", [])[-8:])
            raise DeployFailed(f"{candidate.name}'s engine did not come up in time: {tail}")
        return self.urls[candidate.name]

    def restore(self) -> str:
        return ("the rig holds no deployment: each candidate's engine stays up for the sweep, "
                "then all are stopped")

    def stop_all(self) -> dict[str, Any]:
        codes: dict[str, Any] = {}

        def one(name: str, engine: Any) -> None:
            codes[name] = engine.stop()

        threads = [threading.Thread(target=one, args=item) for item in self.engines.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        return codes


def sweep(urls: dict[str, str], names: list[str], levels: tuple[int, ...], prompts: Path,
          count: int, output_len: int, deadline: float) -> list[dict[str, Any]]:
    """Every candidate at every level through `appliance bench` (the rig's bench), level by
    level (a level the deadline cuts is cut for all candidates alike)."""
    rows: list[dict[str, Any]] = []
    for level in levels:
        for name in names:
            began = time.time()
            if deadline - began < 20:
                rows.append({"candidate": name, "concurrency": level,
                             "skipped": "the rig's deadline"})
                continue
            argv = [sys.executable, "-m", "appliance", "bench", "--url", urls[name],
                    "--concurrency", str(level), "--num-prompts", str(count),
                    "--output-len", str(output_len), "--warmup", "2", "--prompts", str(prompts),
                    "--prompt-format", "jsonl", "--json"]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                                      check=False, timeout=min(180.0, deadline - began - 5))
            except subprocess.TimeoutExpired:
                rows.append({"candidate": name, "concurrency": level,
                             "stopped": "the rig's deadline"})
                continue
            row: dict[str, Any] = {"candidate": name, "concurrency": level, "rc": done.returncode,
                                   "s": round(time.time() - began, 1)}
            try:
                metrics = json.loads(done.stdout)["levels"][0]
                row.update(output_throughput=metrics["output_throughput"],
                           completed=metrics["completed"], errors=metrics["errors"],
                           accept_len=metrics.get("request_accept_len") or metrics.get(
                               "accept_len"),
                           ttft_p50_ms=(metrics.get("ttft_ms") or {}).get("p50"),
                           tpot_p50_ms=(metrics.get("tpot_ms") or {}).get("p50"))
            except (ValueError, KeyError, IndexError, TypeError):
                row["stdout"], row["stderr"] = done.stdout[-2000:], done.stderr[-2000:]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("stdout", "stderr")}),
                  flush=True)
    return rows


def compare(tune: dict[str, Any], rows: list[dict[str, Any]],
            tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """Per level: Tune's pick, its tok/s in the sweep, the sweep's best of all candidates and
    of those Tune may recommend (measured and lossless), and whether the pick is within
    `tolerance` of the latter."""
    from appliance.tune.recommend import eligible

    allowed = eligible(tune["candidates"])
    out = []
    for entry in tune["recommendation"]["per_level"]:
        level, pick = entry["concurrency"], entry["candidate"]
        here = {r["candidate"]: float(r["output_throughput"]) for r in rows
                if r["concurrency"] == level and r.get("output_throughput") is not None
                and r.get("completed") and not r.get("errors")}
        best_any = max(here.items(), key=lambda kv: kv[1]) if here else (None, None)
        fair = {k: v for k, v in here.items() if k in allowed}
        best = max(fair.items(), key=lambda kv: kv[1]) if fair else (None, None)
        picked = here.get(pick) if pick else None
        ratio = picked / best[1] if picked is not None and best[1] else None
        out.append({"concurrency": level, "tune_pick": pick,
                    "tune_pick_tune_tps": entry["output_throughput"],
                    "tune_pick_sweep_tps": picked, "sweep_best": best[0],
                    "sweep_best_tps": best[1], "sweep_best_any": best_any[0],
                    "sweep_best_any_tps": best_any[1], "ratio": ratio,
                    "within": ratio is not None and ratio >= 1 - tolerance})
    return out


def write(name: str, data: Any, *folders: Path | None) -> None:
    text = json.dumps(data, indent=1, default=str)
    for folder in folders:
        if folder is not None:
            (folder / name).write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default=str(Path(os.environ.get("RIG_STASH", "/tmp"))
                                                / "models"))
    parser.add_argument("--fake", action="store_true", help="paced engines instead of SGLang")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)))
    parser.add_argument("--tune-prompts", type=int, default=32, help="Tune's requests per level")
    parser.add_argument("--sweep-prompts", type=int, default=64, help="the sweep's, per level")
    parser.add_argument("--results", type=Path, help="also write tune.json and sweep.json here "
                        "(the device's $OUT: kept even if the call is cut short)")
    parser.add_argument("--output-len", type=int, default=TRAINED_BENCH["bench_output_len"])
    parser.add_argument("--prompts", type=Path, help="JSONL (default: the held-out prompts)")
    parser.add_argument("--start-timeout", type=float, default=240.0)
    parser.add_argument("--reserve", type=float, default=200.0,
                        help="seconds the engines' start leaves for Tune and the sweep")
    parser.add_argument("--only", default="",
                        help="the candidates to run, by name (default: all of Tune's defaults)")
    args = parser.parse_args()
    deadline = float(os.environ.get("RIG_DEADLINE", time.time() + 900))
    levels = tuple(int(x) for x in args.levels.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    prompts_file = args.prompts or Path(args.models) / "trained-target" / "heldout.jsonl"
    if args.fake and not prompts_file.exists():
        prompts_file = args.out / "fake_prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return"})
                                        + "\n" for i in range(64)))
    engine = ({"speculative_draft_model_path": "{models}/trained-dflash",
               "speculative_num_draft_tokens": 8} if args.fake else trained_engine(args.models))
    candidates = default_candidates(engine)
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(wanted) - {c.name for c in candidates})
        if unknown:
            parser.error(f"--only: no candidate named {', '.join(unknown)} (the candidates: "
                         f"{', '.join(c.name for c in candidates)})")
        candidates = [c for c in candidates if c.name in wanted]
    stash = Path(os.environ.get("RIG_STASH", "/tmp"))
    run = RUNS["trained_dflash"]
    pythonpath = ":".join(str(stash / part).format(**run.paths) for part in run.pythonpath)
    deployer = RigDeployer(candidates, args.models, args.out, fake=args.fake,
                           pythonpath=pythonpath)
    text = prompts_file.read_text()
    # The panel's roads: the workload's prompts sampled with the seed, the first distinct ones
    # checked lossless (tune_services.tune_prompts / _lossless_prompts).
    prompts = load_prompts(source="jsonl", count=args.tune_prompts, input_len=0,
                           output_len=args.output_len, seed=0, text=text)
    lossless = list(dict.fromkeys(p.text for p in prompts))[:LOSSLESS_PROMPTS]
    report: dict[str, Any] = {"candidates": [c.to_dict() for c in candidates],
                              "levels": levels, "tune_prompts": args.tune_prompts,
                              "sweep_prompts": args.sweep_prompts,
                              "output_len": args.output_len, "prompts_file": str(prompts_file),
                              "fake": args.fake}
    sweep_rows: list[dict[str, Any]] = []
    try:
        start_timeout = min(args.start_timeout, deadline - time.time() - args.reserve)
        print(f"starting {len(candidates)} engines ({start_timeout:.0f} s at most)", flush=True)
        report["engines"] = deployer.start_all(start_timeout)
        print(json.dumps({"engines": report["engines"]["ready_s"]}), flush=True)
        # Tune gets what is left but for the sweep's share (twice Tune's requests; the
        # deadline cuts its last level first).
        left = deadline - time.time() - 40
        options = TuneOptions(levels=levels, warmup=2, time_budget_s=max(30.0, left * 0.55),
                              lossless_max_tokens=LOSSLESS_MAX_TOKENS)
        report["options"] = {"levels": options.levels, "warmup": options.warmup,
                             "time_budget_s": round(options.time_budget_s, 1),
                             "lossless_max_tokens": options.lossless_max_tokens,
                             "lossless_prompts": len(lossless), "threshold": options.threshold}
        progress = TuneProgress()
        began = time.time()
        result = run_tune(candidates, deployer, prompts, lossless, options, progress)
        report["tune_wall_s"] = round(time.time() - began, 1)
        report["result"] = result.to_dict()
        write("tune.json", report, args.out, args.results)
        print(json.dumps({"tune": result.ended, "seconds": round(result.seconds, 1),
                          "summary": result.recommendation["summary"],
                          "per_level": result.recommendation["per_level"]}, default=str),
              flush=True)
        # Every candidate whose engine serves, measured by Tune or not (a Tune cut short by
        # its budget is then compared with what it did not reach too: `sweep_best_any`).
        names = [c.name for c in candidates if deployer.ready_s.get(c.name) is not None]
        sweep_rows = sweep(deployer.urls, names, levels, prompts_file, args.sweep_prompts,
                           args.output_len, deadline - 25)
        compared = compare(result.to_dict(), sweep_rows)
        write("sweep.json", {"rows": sweep_rows, "compare": compared, "tolerance": TOLERANCE,
                             "prompts": args.sweep_prompts, "bench": "appliance bench (chat "
                             "endpoint, as Tune), each candidate alone, level by level"},
              args.out, args.results)
        for entry in compared:
            print(json.dumps(entry), flush=True)
    finally:
        report["stopped"] = deployer.stop_all()
        if "result" in report:
            write("tune.json", report, args.out, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
