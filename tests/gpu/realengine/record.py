"""Start the real SGLang engine once and record everything it says and serves.

    python3 tests/gpu/realengine/record.py RUN OUTDIR   (RUN: a name in runs.RUNS)

Writes OUTDIR/RUN/:
- engine.log: stdout and stderr, each line prefixed with its arrival time as `docker logs -t`
  prints it (RFC 3339, nanoseconds, Z), so the agent's own follower code reads it unchanged;
- metrics.jsonl: /metrics every 2 s from the start to the stop, through idle, load and idle
  again ({"t", "phase", "status", "text"});
- server_info.json, models.json; sse_completions.txt and sse_chat.txt: the raw bytes of
  streamed OpenAI responses, each network chunk as {"t", "data"} on a line;
- probe.json: the losslessness prompts at temperature 0 with return_logprob and top-2
  log-probs (/generate, sequential), with each answer's meta_info;
- bench.json: `appliance bench` at each concurrency level, with its wall-clock window;
- refusals.json (runs with refusals): each request a speculative engine may refuse (grammar,
  tools, log-probs, n, a stop string, prompts at the context length), what was sent and the
  engine's answer as it came (status, body), with /health after each;
- verify.json (runs with a companion): `appliance verify --json`, this engine against the
  companion's (its own log in companion/engine.log);
- load_predict.json (predict_load runs): the product's read rate and load-time prediction for
  the model folder from a cold page cache, and the rig's own timed read as a cross-check;
- run.json: argv, env, the substitutions and why, the self-check, timings, exit status.
Stdlib and the checkout's `appliance` package only (the GPU host's python runs it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))

from runs import COMPANION_PORT, PROBE_PROMPTS, RUNS, Run  # noqa: E402
from substitutions import Launch, launch  # noqa: E402

from appliance.bench.lossless import TOP_LOGPROBS  # noqa: E402

# Runs of one wave share the GPU: each its own port (real-engine.sh sets RIG_PORT).
PORT = int(os.environ.get("RIG_PORT", "30000"))
BASE = f"http://127.0.0.1:{PORT}"
# A run's companion listens on the next port (COMPANION_PORT for a run alone on 30000).
COMPANION = PORT + COMPANION_PORT - 30000
# With RIG_SHARED_GPU=N (N runs at once), each engine's KV pool is capped: SGLang sizes it
# from the memory free when it looks, so the first engine up would take what the others need.
SHARED_KV_TOKENS = 400_000
READY = "The server is fired up and ready to roll"
SCRAPE_S = 2.0
IDLE_S = 8.0


def docker_stamp(now: float) -> str:
    moment = datetime.fromtimestamp(now, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int((now % 1) * 1e9):09d}Z"


class Engine:
    """The engine process, its timestamped output and its flags as they appear."""

    def __init__(self, plan: Launch, env: dict[str, str], folder: Path) -> None:
        self.folder = folder
        self.lines: list[str] = []
        self.started = time.time()
        self.proc = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, cwd="/tmp", start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.folder / "engine.log", "w", encoding="utf-8") as log:
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(f"{docker_stamp(time.time())} {line}\n")
                log.flush()
                self.lines.append(line)

    def seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait_for(self, text: str, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            if self.seen(text):
                return True
            time.sleep(0.25)
        return self.seen(text)

    def stop(self) -> int | None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        time.sleep(1)
        # What is left of the engine's own process group (scheduler, detokenizer).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.reader.join(timeout=10)
        return self.proc.returncode


class Scraper(threading.Thread):
    """/metrics every SCRAPE_S seconds, tagged with the phase the driver is in."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.phase = "starting"
        self.halt = threading.Event()
        self.path = folder / "metrics.jsonl"

    def run(self) -> None:
        with open(self.path, "w", encoding="utf-8") as out:
            while not self.halt.is_set():
                tick = time.time()
                status, text = get_text("/metrics", timeout=1.5)
                out.write(json.dumps({"t": docker_stamp(tick), "phase": self.phase, "status": status,
                                      "text": text if status == 200 else ""}) + "\n")
                out.flush()
                self.halt.wait(max(0.0, SCRAPE_S - (time.time() - tick)))


def get_text(path: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(BASE + path, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def post_json(path: str, body: dict[str, Any], timeout: float = 120,
              base: str = BASE) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def stream_raw(path: str, body: dict[str, Any], out: Path) -> None:
    """The response's bytes as they arrive, one network read a line, with its time."""
    request = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with open(out, "w", encoding="utf-8") as sink:
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                sink.write(json.dumps({"status": response.status,
                                       "headers": dict(response.headers.items())}) + "\n")
                while chunk := response.read1(65536):
                    sink.write(json.dumps({"t": docker_stamp(time.time()),
                                           "data": chunk.decode("utf-8", "replace")}) + "\n")
        except OSError as exc:
            sink.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")


def served_model() -> str:
    status, text = get_text("/v1/models")
    try:
        return str(json.loads(text)["data"][0]["id"]) if status == 200 else "default"
    except (ValueError, KeyError, IndexError):
        return "default"


def probe(folder: Path, base: str = BASE, name: str = "probe.json", top: int = 2,
          deadline: float | None = None) -> None:
    """Each prompt with the top-2 log-probs; where the engine refuses them (433c58ed7's DFLASH
    and DDTREE answer 400 "does not support return_logprob yet"), the refusal is kept and the
    prompt is sent again without them: the baseline's log-probs judge where outputs part."""
    answers = []
    for prompt in PROBE_PROMPTS:
        if deadline is not None and time.time() > deadline:
            answers.append({"prompt": prompt, "skipped": "the rig's deadline"})
            continue
        began = time.time()
        sampling = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
        status, body = post_json("/generate", {"text": prompt, "return_logprob": True,
                                               "top_logprobs_num": top, "sampling_params": sampling},
                                 base=base)
        answer = {"prompt": prompt, "logprobs": status == 200}
        if status != 200:
            answer["refused"] = {"status": status, "body": body}
            status, body = post_json("/generate", {"text": prompt, "sampling_params": sampling},
                                     base=base)
        answer.update(status=status, s=round(time.time() - began, 3), response=body)
        answers.append(answer)
    (folder / name).write_text(json.dumps(answers))


def bench(folder: Path, levels: tuple[int, ...], deadline: float, prompts: str | None = None,
          output_len: int = 64) -> None:
    """`appliance bench` per level; a level the deadline leaves no room for is skipped, and one
    that outruns it is stopped and said so (the recording keeps what the others measured).
    `prompts`: a JSONL file of prompts instead of the bench's synthetic words."""
    results: list[dict[str, Any]] = []
    for level in levels:
        began = time.time()
        if deadline - began < 30:
            results.append({"concurrency": level, "skipped": "the rig's deadline"})
            continue
        argv = [sys.executable, "-m", "appliance", "bench", "--url", BASE, "--concurrency",
                str(level), "--num-prompts", str(max(8, 2 * level)), "--input-len", "128",
                "--output-len", str(output_len), "--endpoint", "/v1/completions", "--warmup", "1",
                "--json"]
        if prompts:
            argv += ["--prompts", prompts, "--prompt-format", "jsonl"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=HERE.parents[2],
                                  check=False, timeout=min(240.0, deadline - began))
        except subprocess.TimeoutExpired:
            results.append({"concurrency": level, "start": docker_stamp(began),
                            "end": docker_stamp(time.time()), "rc": None,
                            "stopped": "the rig's deadline"})
            continue
        results.append({"concurrency": level, "start": docker_stamp(began),
                        "end": docker_stamp(time.time()), "rc": done.returncode,
                        "json": _json_or_none(done.stdout), "stderr": done.stderr[-4000:]})
    (folder / "bench.json").write_text(json.dumps(results, indent=1))


def ask(path: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """One request and the answer as it came: status, content type, the body (JSON where it
    parses, else the text: a stream's events stay raw), seconds."""
    began = time.time()
    request = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, kind, raw = response.status, response.headers.get("Content-Type"), response.read()
    except urllib.error.HTTPError as exc:
        status, kind, raw = exc.code, exc.headers.get("Content-Type"), exc.read()
    except OSError as exc:
        return {"status": 0, "error": f"{type(exc).__name__}: {exc}",
                "s": round(time.time() - began, 3)}
    text = raw.decode("utf-8", "replace")
    parsed = _json_or_none(text)
    return {"status": status, "content_type": kind, "body": text if parsed is None else parsed,
            "s": round(time.time() - began, 3)}


def refusal_requests(model: str, context: int) -> list[tuple[str, str, dict[str, Any], str]]:
    """(name, path, body, what the body's long prompt is, if any) in the order sent: the
    context-length prompts last (an engine that falls over on them takes nothing else down)."""
    def chat(content: str, **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": 64, "temperature": 0, **extra}

    person = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    ask_person = "Give me a person as JSON with a name and an age."
    return [
        ("json_schema", "/v1/chat/completions", chat(ask_person, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": person}}), ""),
        ("json_schema_stream", "/v1/chat/completions", chat(ask_person, stream=True, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": person}}), ""),
        ("json_object", "/v1/chat/completions",
         chat(ask_person, response_format={"type": "json_object"}), ""),
        ("tool_required", "/v1/chat/completions",
         chat("What is the weather in Paris?", tools=[weather], tool_choice="required"), ""),
        ("tool_auto", "/v1/chat/completions",
         chat("What is the weather in Paris?", tools=[weather], tool_choice="auto"), ""),
        ("logprobs_chat", "/v1/chat/completions",
         chat("Say hello in three words.", logprobs=True, top_logprobs=2), ""),
        ("logprobs_chat_stream", "/v1/chat/completions",
         chat("Say hello in three words.", logprobs=True, top_logprobs=2, stream=True), ""),
        ("logprobs_completion", "/v1/completions",
         {"model": model, "prompt": PROBE_PROMPTS[0], "max_tokens": 16, "temperature": 0,
          "logprobs": 2}, ""),
        ("n2", "/v1/chat/completions", chat("Say hello in three words.", n=2, temperature=0.8), ""),
        ("stop_reference", "/v1/completions",
         {"model": model, "prompt": PROBE_PROMPTS[1], "max_tokens": 48, "temperature": 0,
          "ignore_eos": True}, ""),
        # the stop string is cut from stop_reference's text (see refusals())
        ("stop", "/v1/completions",
         {"model": model, "prompt": PROBE_PROMPTS[1], "max_tokens": 48, "temperature": 0,
          "ignore_eos": True}, ""),
        ("long_fits", "/v1/completions",
         {"model": model, "prompt": "a" * (context - 100), "max_tokens": 32, "temperature": 0},
         f"'a' x {context - 100} (one token each: {context - 100} tokens)"),
        ("long_over", "/v1/completions",
         {"model": model, "prompt": "a" * (context - 16), "max_tokens": 32, "temperature": 0},
         f"'a' x {context - 16} (one token each: {context - 16} tokens)"),
    ]


def context_length(folder: Path) -> int:
    try:
        return int(json.loads((folder / "models.json").read_text())["data"][0]["max_model_len"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return 262144


def refusals(folder: Path, deadline: float) -> None:
    answers: list[dict[str, Any]] = []
    stop_text = None
    for name, path, body, long_prompt in refusal_requests(served_model(), context_length(folder)):
        if name == "stop":
            if stop_text is None:
                answers.append({"name": name, "skipped": "stop_reference gave no text"})
                continue
            body = {**body, "stop": [stop_text]}
        if time.time() > deadline - (150 if long_prompt else 10):
            answers.append({"name": name, "skipped": "the rig's deadline"})
            continue
        sent = {**body, "prompt": long_prompt} if long_prompt else body
        answer = ask(path, body, timeout=180 if long_prompt else 120)
        if name == "stop_reference":
            try:
                text = str(answer["body"]["choices"][0]["text"])
            except (KeyError, IndexError, TypeError):
                text = ""
            stop_text = text[12:15] if len(text) >= 15 else None
        health = get_text("/health", timeout=10)[0]
        answers.append({"name": name, "path": path, "sent": sent, **answer, "health_after": health})
    (folder / "refusals.json").write_text(json.dumps(answers, indent=1))


def wave_done(name: str) -> Path:
    return Path(os.environ.get("RIG_STASH", "/tmp")) / "wave" / f"{name}.done"


@contextlib.contextmanager
def serve_lock(run: Run, deadline: float) -> Any:
    """An exclusive run serves once the other runs of its wave (RIG_WAVE) have stopped, and one
    exclusive run at a time (the rig's lock), so that its speed is not another engine's load
    (an idle SGLang scheduler still spins a CPU core). Others go on at once."""
    if not run.exclusive_serve:
        yield
        return
    wave = [name for name in os.environ.get("RIG_WAVE", "").split(",") if name in RUNS]
    others = [name for name in wave if not RUNS[name].exclusive_serve]
    while any(not wave_done(name).exists() for name in others) and time.time() < deadline - 120:
        time.sleep(1)
    with open(Path(os.environ.get("RIG_STASH", "/tmp")) / "serve.lock", "w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline - 60:
                    break  # serve anyway, disturbed, rather than not at all
                time.sleep(0.5)
        yield


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def verify_against_companion(folder: Path) -> None:
    """The product's losslessness check, this engine (A) against the companion (B)."""
    began = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "verify", "--a", BASE,
         "--b", f"http://127.0.0.1:{COMPANION}", "--json"],
        capture_output=True, text=True, cwd=HERE.parents[2], timeout=400, check=False)
    (folder / "verify.json").write_text(json.dumps({
        "rc": done.returncode, "s": round(time.time() - began, 1),
        "json": _json_or_none(done.stdout), "stdout": done.stdout[-20000:] if
        _json_or_none(done.stdout) is None else "", "stderr": done.stderr[-4000:]}, indent=1))


def evict(folder: Path) -> dict[str, Any]:
    """Drop the folder's files from the page cache: fadvise DONTNEED per file (any user), and
    the kernel's drop_caches where this root may write it."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        dropped = True
    except OSError:
        dropped = False
    return {"fadvise": True, "drop_caches": dropped}


def timed_read(folder: Path) -> dict[str, Any]:
    """The rig's cross-check: every weight file read once in 16 MiB reads, cold."""
    total, began = 0, time.time()
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(16 << 20):
                total += len(chunk)
    seconds = time.time() - began
    return {"bytes": total, "s": round(seconds, 3), "gb_per_s": round(total / seconds / 1e9, 3)}


def predict_load(folder: Path, model: Path) -> None:
    """Before the engine starts: the product's read rate and prediction, then the rig's read,
    each from a cold page cache; evicted once more so the engine reads the disk too."""
    result: dict[str, Any] = {"model": str(model), "files": {
        p.name: p.stat().st_size for p in sorted(model.iterdir()) if p.is_file()}}
    for name, argv in (("read_rate", ["store", "read-rate", str(model)]),
                       ("predict", ["store", "predict", str(model)])):
        result[f"evict_before_{name}"] = evict(model)
        done = subprocess.run([sys.executable, "-m", "appliance", *argv], capture_output=True,
                              text=True, cwd=HERE.parents[2], timeout=180, check=False)
        result[name] = {"argv": argv, "rc": done.returncode, "json": _json_or_none(done.stdout),
                        "stdout": done.stdout[-4000:], "stderr": done.stderr[-4000:]}
    result["evict_before_timed_read"] = evict(model)
    result["timed_read"] = timed_read(model)
    result["evict_before_engine"] = evict(model)
    (folder / "load_predict.json").write_text(json.dumps(result, indent=1))


def serve_and_record(run: Run, folder: Path, scraper: Scraper, deadline: float,
                     bench_prompts: str | None = None) -> None:
    """Requests, probe, refusals and bench, each step skipped where the deadline (the engine's
    stop leaves it room) comes first."""
    scraper.phase = "idle"
    time.sleep(IDLE_S)
    scraper.phase = "load"
    for path, name in (("/get_server_info", "server_info.json"), ("/v1/models", "models.json")):
        status, text = get_text(path)
        (folder / name).write_text(text if status == 200 else json.dumps({"status": status, "text": text}))
    model = served_model()
    stream_raw("/v1/completions", {"model": model, "prompt": PROBE_PROMPTS[1], "max_tokens": 48,
                                   "temperature": 0, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}},
               folder / "sse_completions.txt")
    stream_raw("/v1/chat/completions", {
        "model": model, "max_tokens": 48, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Say hello in three words."}]},
        folder / "sse_chat.txt")
    with serve_lock(run, deadline):
        if run.probe:
            probe(folder, deadline=deadline)
        if run.companion:
            verify_against_companion(folder)
            # B's own answers with as many log-probs as the check asks for: the tests re-judge.
            probe(folder, base=f"http://127.0.0.1:{COMPANION}", name="probe_companion.json",
                  top=TOP_LOGPROBS, deadline=deadline)
        if run.bench_levels:
            bench(folder, run.bench_levels, deadline, prompts=bench_prompts,
                  output_len=run.bench_output_len)
    if run.refusals:
        refusals(folder, deadline)
    scraper.phase = "idle-after"
    time.sleep(IDLE_S)


def self_check(plan: Launch, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """The image runs the appliance's GPU self-check before the engine: so does the rig."""
    began = time.time()
    done = subprocess.run([sys.executable, "-m", "appliance.selfcheck", *plan.gpu_check, "--stream"],
                          capture_output=True, text=True, env=env, cwd=HERE.parents[2],
                          timeout=180, check=False)
    (folder / "selfcheck.stream").write_text(done.stdout)
    return {"rc": done.returncode, "s": round(time.time() - began, 1), "stderr": done.stderr[-2000:]}


def record(run: Run, out: Path, models: str, pythonpath: str, deadline: float) -> dict[str, Any]:
    folder = out / run.name
    folder.mkdir(parents=True, exist_ok=True)
    argv_overrides = {**run.argv_overrides, "--port": str(PORT)}
    shared = int(os.environ.get("RIG_SHARED_GPU", "1"))
    if shared > 1 and run.expect == "ready":
        argv_overrides.setdefault("--max-total-tokens", str(SHARED_KV_TOKENS))
    plan = launch(run.example, models, spec_overrides=run.spec_overrides,
                  argv_overrides=argv_overrides, drop_flags=run.drop_flags, grammar=run.grammar)
    for name, (value, why) in run.env.items():
        plan.env[name] = value
        plan.changes.append(f"env {name}={value}: {why}")
    plan.changes.extend(run.notes)
    if shared > 1:
        plan.changes.append(f"{shared} runs share the GPU at once (RIG_SHARED_GPU), this one on "
                            f"port {PORT}" + ("; --max-total-tokens caps its KV pool so that "
                                              "each engine finds memory" if run.expect == "ready"
                                              else ""))
    env = {**os.environ, **plan.env, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"}
    info: dict[str, Any] = {"run": run.name, "about": run.about, "argv": plan.argv,
                            "env_added": plan.env, "changes": plan.changes,
                            "source": run.source, "expect": run.expect}
    if run.self_check:
        info["self_check"] = self_check(plan, env, folder)
    companion = None
    if run.companion:
        other = RUNS[run.companion]
        (folder / "companion").mkdir(exist_ok=True)
        other_plan = launch(other.example, models, spec_overrides=other.spec_overrides,
                            argv_overrides={**other.argv_overrides, "--port": str(COMPANION)},
                            drop_flags=other.drop_flags)
        info["companion"] = {"run": other.name, "argv": other_plan.argv,
                             "changes": other_plan.changes}
        companion = Engine(other_plan, {**env, **other_plan.env}, folder / "companion")
        up = companion.wait_for(READY, min(other.start_timeout, deadline - time.time() - 200))
        info["companion"]["ready_s"] = round(time.time() - companion.started, 1) if up else None
    if run.predict_load:
        predict_load(folder, Path(str(run.spec_overrides["engine.model_path"]).format(models=models)))
    engine = Engine(plan, env, folder)
    scraper = Scraper(folder)
    scraper.start()
    budget = min(run.start_timeout, deadline - time.time() - 45)
    if run.expect == "ready":
        ready = engine.wait_for(READY, budget)
        info["ready_s"] = round(time.time() - engine.started, 1) if ready else None
        if ready and run.serve:
            prompts = run.bench_prompts.format(models=models) if run.bench_prompts else None
            serve_and_record(run, folder, scraper, deadline - 50, prompts)
    else:
        engine.wait_for(run.stop_after or "\0never", budget)
        info["ready_s"] = round(time.time() - engine.started, 1) if engine.seen(READY) else None
    info["exited_by_itself"] = engine.proc.poll()
    scraper.phase = "stopping"
    info["returncode"] = engine.stop()
    if companion is not None:
        info["companion"]["returncode"] = companion.stop()
    scraper.halt.set()
    scraper.join(timeout=5)
    info["total_s"] = round(time.time() - engine.started, 1)
    (folder / "run.json").write_text(json.dumps(info, indent=1))
    wave_done(run.name).parent.mkdir(parents=True, exist_ok=True)
    wave_done(run.name).touch()
    return info


def dry_run(names: list[str], stash: Path) -> None:
    """What each run would start, without starting it: argv, added environment, changes and
    PYTHONPATH (a stash that does not exist yet is fine)."""
    for name in names:
        run = RUNS[name]
        plan = launch(run.example, str(stash / "models"), spec_overrides=run.spec_overrides,
                      argv_overrides={**run.argv_overrides, "--port": str(PORT)},
                      drop_flags=run.drop_flags, grammar=run.grammar)
        for env_name, (value, why) in run.env.items():
            plan.env[env_name] = value
            plan.changes.append(f"env {env_name}={value}: {why}")
        plan.changes.extend(run.notes)
        pythonpath = ":".join(str(stash / part).format(**run.paths) for part in run.pythonpath)
        print(json.dumps({"run": name, "argv": plan.argv, "env_added": plan.env,
                          "pythonpath": pythonpath, "changes": plan.changes}, indent=1))


def main() -> None:
    if sys.argv[1] == "--dry-run":
        # `record.py --dry-run RUN...`: the runs' argv, checked on any machine.
        dry_run(sys.argv[2:], Path(os.environ.get("RIG_STASH", "/root/stash")))
        return
    name, out = sys.argv[1], Path(sys.argv[2])
    run = RUNS[name]
    deadline = float(os.environ.get("RIG_DEADLINE", time.time() + 600))
    stash = Path(os.environ["RIG_STASH"])
    pythonpath = ":".join(str(stash / part).format(**run.paths) for part in run.pythonpath)
    info = record(run, out, str(stash / "models"), pythonpath, deadline)
    print(f"[{name}] ready={info['ready_s']} rc={info['returncode']} total={info['total_s']} s",
          flush=True)


if __name__ == "__main__":
    main()
