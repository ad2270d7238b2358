"""Failures whose fix is a value of the spec (appliance.logs.spec_causes): the diagnosis names
the form field and the spec key, and quotes the value at fault.

- missing_model: the real engine's recording (433c58ed7, a target path that does not exist).
- tests/fixtures/logs/drafter_not_found.log: that recording with the frames 433c58ed7 runs
  for a drafter path (server_args.py line 3026 handle_speculative_decoding ->
  arg_groups/speculative_hook.py line 98, line 36 _resolve_speculative_algorithm_alias ->
  get_config) and the drafter's path quoted; made from the source text until the rig
  records the case.
- tests/fixtures/logs/fewer_gpus_visible.log: TP2 in a container with one GPU, as 433c58ed7
  prints it (distributed/bootstrap.py init_torch_distributed logs its "Context:" line, then
  the scheduler's traceback on TP1 with torch's invalid-device-ordinal text); also made from
  the source text until the rig's recording.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from appliance.logs.diagnosis import diagnose
from appliance.logs.stamps import without_docker_stamps
from tests import real_engine as rec

ROOT = Path(__file__).resolve().parents[3]
LOGS = ROOT / "tests" / "fixtures" / "logs"
TARGET_TYPO = "/models/Kimi-K2.7-typo"
DRAFTER_TYPO = "/models/tiny-kimi-dflash-typo"


def _diagnose(path: Path, facts: dict[str, Any] | None = None) -> Any:
    with open(path, encoding="utf-8", newline="\n") as log:
        found = diagnose(without_docker_stamps(log), facts)
    assert found is not None
    return found


def test_a_missing_target_path_names_model_path_and_quotes_it() -> None:
    found = _diagnose(rec.folder("missing_model") / "engine.log")
    assert found.cause == "model-not-found"
    assert "Model path in the form" in found.fix and "engine.model_path" in found.fix
    assert repr(TARGET_TYPO) in found.fix and repr(TARGET_TYPO) in found.summary
    assert found.evidence["path"] == TARGET_TYPO


def test_a_missing_drafter_path_is_told_from_the_target_by_its_frames() -> None:
    found = _diagnose(LOGS / "drafter_not_found.log")
    assert found.cause == "drafter-not-found"
    assert "Drafter path in the form" in found.fix
    assert "engine.speculative_draft_model_path" in found.fix
    assert repr(DRAFTER_TYPO) in found.fix and "engine.model_path" not in found.fix
    assert found.evidence == {"path": DRAFTER_TYPO,
                              "field": "engine.speculative_draft_model_path", "line": 4}


def test_the_specs_paths_say_whose_path_it_is_when_the_frames_do_not() -> None:
    log = rec.folder("missing_model") / "engine.log"
    drafter = _diagnose(log, {"model_path": "/models/kimi",
                              "speculative_draft_model_path": TARGET_TYPO})
    assert drafter.cause == "drafter-not-found" and repr(TARGET_TYPO) in drafter.fix
    target = _diagnose(LOGS / "drafter_not_found.log",
                       {"model_path": DRAFTER_TYPO, "speculative_draft_model_path": "/models/d"})
    assert target.cause == "model-not-found"


def test_fewer_visible_gpus_than_tp_size_names_the_count_and_tp_size() -> None:
    found = _diagnose(LOGS / "fewer_gpus_visible.log")
    assert found.cause == "fewer-gpus-visible"
    assert "tp_size 2 x pp_size 1 = 2 GPUs" in found.summary
    assert "sees at most 1" in found.summary and "TP1" in found.summary
    assert found.evidence["visible_at_most"] == 1 and found.evidence["tp_size"] == 2
    assert found.evidence["container_cuda_visible_devices"] is None


def test_a_spec_with_too_few_gpus_gets_the_gpu_list_and_tp_size_to_change() -> None:
    found = _diagnose(LOGS / "fewer_gpus_visible.log", {"gpus": [0], "tp_size": 2})
    assert "GPU ids in the form (spec key gpus), now [0]" in found.fix
    assert "TP size in the form (spec key engine.tp_size), now 2, to 1" in found.fix
    assert "the spec lists GPUs [0] (1)" in found.summary


def test_a_spec_with_enough_gpus_points_at_the_runtime_not_the_spec() -> None:
    found = _diagnose(LOGS / "fewer_gpus_visible.log", {"gpus": [0, 1], "tp_size": 2})
    assert "now [0, 1]" in found.fix and "NVIDIA runtime" in found.fix
    assert "CUDA_VISIBLE_DEVICES" in found.fix


def test_diagnose_on_the_command_line_reads_the_specs_paths(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "kimi-ddtree.yaml").read_text())
    data["engine"]["speculative_draft_model_path"] = TARGET_TYPO
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "diagnose", "--spec", str(spec),
         str(rec.folder("missing_model") / "engine.log")],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    found = json.loads(result.stdout)["diagnosis"]
    assert found["cause"] == "drafter-not-found", result.stderr
    assert repr(TARGET_TYPO) in found["fix"]
