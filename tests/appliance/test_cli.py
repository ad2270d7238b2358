"""The `appliance` command line, run as a real subprocess (`python -m appliance`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = ROOT / "examples" / "kimi-ddtree.yaml"

# A DDTree start-up that dies replaying the target verify graph (TP0 and TP1 shown), in the
# shapes SGLang prints: rank prefixes, a \r-separated tqdm bar, a multi-line traceback.
FAILED_DDTREE_LOG = (
    "[2026-05-02 09:00:13 TP0] Load weight begin. avail mem=137.52 GB\n"
    "[2026-05-02 09:00:13 TP1] Load weight begin. avail mem=137.52 GB\n"
    "Loading safetensors checkpoint shards:   0% Completed | 0/64 [00:00<?, ?it/s]\r"
    "Loading safetensors checkpoint shards:  50% Completed | 32/64 [02:41<02:41,  5.05s/it]\r"
    "Loading safetensors checkpoint shards: 100% Completed | 64/64 [05:22<00:00,  5.05s/it]\n"
    "[2026-05-02 09:06:35 TP0] Load weight end. elapsed=382.41 s, type=DeepseekV3ForCausalLM, "
    "quant=compressed-tensors, avail mem=63.18 GB, mem usage=74.34 GB.\n"
    "[2026-05-02 09:06:44 TP0] KV Cache is allocated. #tokens: 1118208, KV size: 39.86 GB\n"
    "[2026-05-02 09:06:45 TP0] Capture cuda graph begin. This can take up to several minutes. "
    "avail mem=20.11 GB\n"
    "[2026-05-02 09:06:56 TP0] Capture cuda graph end. Time elapsed: 10.12 s. mem usage=1.10 GB. "
    "avail mem=19.01 GB.\n"
    "[2026-05-02 09:07:03] The server is fired up and ready to roll!\n"
    "[2026-05-02 09:07:05 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2968, '
    "in run_scheduler_process\n"
    "    scheduler.event_loop_normal()\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", '
    "line 871, in replay\n"
    "    self.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)\n"
    "RuntimeError: The size of tensor a (8) must match the size of tensor b (33) at "
    "non-singleton dimension 0\n"
    "\n"
    "[2026-05-02 09:07:05] Received sigquit from a child process. It usually means the child "
    "failed.\n"
)


# No models folder for the command line to look in, whatever this machine has at /models (a
# bind mount of an earlier Docker test may have made an empty one): the flagship's folders
# are then "not checked", never "missing". Tests that want a folder pass --models-dir.
NO_MODELS_DIR = str(ROOT / "var" / "no-such-models-folder")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APPLIANCE_MODELS_DIR": NO_MODELS_DIR}
    return subprocess.run([sys.executable, "-m", "appliance", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)


def write_spec(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load(FLAGSHIP.read_text())
    engine = changes.pop("engine", {})
    data["engine"].update(engine)
    data.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_launch_args_prints_the_engine_argv_and_env_as_json() -> None:
    result = run("launch-args", str(FLAGSHIP))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    argv = plan["argv"]
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "32"
    assert plan["env"]["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"


def test_launch_args_applies_the_recipes_recommended_defaults() -> None:
    argv = json.loads(run("launch-args", str(FLAGSHIP)).stdout)["argv"]
    assert argv[argv.index("--reasoning-parser") + 1] == "kimi_k2"
    assert argv[argv.index("--page-size") + 1] == "1"
    assert argv[argv.index("--attention-backend") + 1] == "fa3"


def test_launch_args_text_is_one_command_line() -> None:
    result = run("launch-args", str(FLAGSHIP), "--text")
    assert result.stdout.startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python3 -m ")


def test_preflight_exits_0_for_the_flagship_spec() -> None:
    result = run("preflight", str(FLAGSHIP))
    assert result.returncode == 0, result.stdout
    findings = json.loads(result.stdout)["findings"]
    # No models folder on this machine: the folders are said to be unchecked, not passed.
    assert {f["rule"] for f in findings} == {"ddtree-verify-width", "model-files-not-checked"}
    assert set(findings[0]) == {"rule", "severity", "field", "message", "fix"}


def test_preflight_exits_1_on_an_error_finding(tmp_path: Path) -> None:
    path = write_spec(tmp_path, engine={"attention_backend": "flashinfer", "pp_size": 2})
    result = run("preflight", str(path))
    assert result.returncode == 1
    rules = {f["rule"] for f in json.loads(result.stdout)["findings"] if f["severity"] == "error"}
    assert {"dflash-pipeline-parallel", "parallel-gpu-count"} <= rules


def test_preflight_reads_local_configs_and_takes_the_gpu_memory(tmp_path: Path) -> None:
    model = tmp_path / "kimi"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 64,
                                                   "kv_lora_rank": 512,
                                                   "num_hidden_layers": 61}))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2000 * 1024**3}}))
    path = write_spec(tmp_path, engine={"model_path": str(model)})
    result = run("preflight", str(path), "--gpu-memory-gb", "141", "--text")
    assert result.returncode == 1
    assert "error   gpu-memory" in result.stdout


def test_preflight_text_ends_with_a_count() -> None:
    result = run("preflight", str(FLAGSHIP), "--text")
    assert result.stdout.strip().splitlines()[-1] == "0 error(s), 0 warning(s)"


def test_a_bad_spec_exits_2_with_field_errors_not_a_traceback(tmp_path: Path) -> None:
    path = write_spec(tmp_path, engine={"tp_sise": 8, "port": "http"}, gpus=[0, 0])
    for command in ("launch-args", "preflight"):
        result = run(command, str(path))
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        fields = {e["field"] for e in json.loads(result.stdout)["errors"]}
        assert fields == {"engine.tp_sise", "engine.port", "gpus"}


def test_a_bad_spec_in_text_mode_prints_each_fix(tmp_path: Path) -> None:
    path = write_spec(tmp_path, engine={"tp_sise": 8})
    result = run("launch-args", str(path), "--text")
    assert result.returncode == 2
    assert "did you mean 'tp_size'" in result.stdout and "fix:" in result.stdout


def test_a_missing_spec_file_exits_2() -> None:
    result = run("preflight", "/nonexistent/spec.yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_an_unknown_recipe_is_a_preflight_error(tmp_path: Path) -> None:
    path = write_spec(tmp_path, recipe="kimi-k2.6-dtree")
    result = run("preflight", str(path))
    assert result.returncode == 1
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["rule"] == "recipe" and "kimi-k2.6-ddtree" in finding["fix"]


def test_parse_log_prints_one_json_event_per_line(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(FAILED_DDTREE_LOG)
    result = run("parse-log", str(log))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "weights_begin" and "ready" in kinds and "error" in kinds
    progress = [e for e in events if e["kind"] == "weights_progress"]
    assert (progress[-1]["done"], progress[-1]["total"]) == (64, 64)
    assert all(isinstance(e["line"], int) and e["line"] >= 1 for e in events)


def test_parse_log_reads_stdin_and_prints_every_line_with_all() -> None:
    plain = run("parse-log", "-", stdin=FAILED_DDTREE_LOG)
    every = run("parse-log", "-", "--all", stdin=FAILED_DDTREE_LOG)
    assert len(every.stdout.splitlines()) > len(plain.stdout.splitlines())
    assert any(json.loads(line)["kind"] == "line" for line in every.stdout.splitlines())


def test_diagnose_names_the_ddtree_verify_width_fault(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(FAILED_DDTREE_LOG)
    result = run("diagnose", str(log))
    assert result.returncode == 0
    diagnosis = json.loads(result.stdout)["diagnosis"]
    assert diagnosis["cause"] == "ddtree-verify-width"


def test_diagnose_says_when_no_cause_was_found(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("[2026-05-02 09:07:03] The server is fired up and ready to roll!\n")
    assert json.loads(run("diagnose", str(log)).stdout) == {"diagnosis": None}
    assert run("diagnose", str(log), "--text").stdout.strip() == "no failure cause found"


def test_the_usage_error_exits_2() -> None:
    assert run("no-such-command").returncode == 2


def test_gpu_check_hands_its_own_arguments_to_the_gpu_check() -> None:
    assert "--verify-width" in run("gpu-check", "--help").stdout
    result = run("gpu-check", "--max-bs", "0")
    assert result.returncode == 2
    assert json.loads(result.stdout)["ok"] is False


def test_preflight_checks_the_attention_backend_against_a_named_gpu(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: kimi\nrecipe: kimi-k2.6-ddtree\ngpus: [0, 1]\nengine:\n"
                         "  model_path: /models/Kimi-K2.6\n  tp_size: 2\n"
                         "  speculative_draft_model_path: /models/Kimi-K2.6-DFlash\n")
    on_b200 = run("preflight", str(spec_file), "--gpu-name", "NVIDIA B200")
    rules = {f["rule"]: f for f in json.loads(on_b200.stdout)["findings"]}
    assert on_b200.returncode == 1 and rules["gpu-arch-attention-backend"]["severity"] == "error"
    on_h200 = run("preflight", str(spec_file), "--gpu-name", "NVIDIA H200")
    assert "gpu-arch-attention-backend" not in on_h200.stdout


def test_causes_lists_the_whole_failure_catalogue() -> None:
    listed = json.loads(run("causes").stdout)["causes"]
    ids = {row["id"] for row in listed}
    assert {"cuda-oom-capture", "image-build-failed", "no-gpu-runtime", "model-not-ready"} <= ids
    assert all(row["summary"] and row["fix"] for row in listed)
    text = run("causes", "--text").stdout
    assert "image-build-failed (appliance, priority 0)" in text
