"""`appliance preflight SPEC` checks the spec's model and drafter folders as the panel does
(appliance.preflight.folders: /models/<name> under the host's models folder), or says plainly
that it did not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = ROOT / "examples" / "kimi-ddtree.yaml"  # /models/Kimi-K2.6 and its DFlash drafter
DRAFTER_FIELD = "engine.speculative_draft_model_path"


def _preflight(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict]]:
    result = subprocess.run([sys.executable, "-m", "appliance", "preflight", str(FLAGSHIP), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, **(env or {})})
    return result.returncode, json.loads(result.stdout)["findings"]


def _checkpoint(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)


def _on(findings: list[dict], field: str) -> list[tuple[str, str]]:
    return [(f["rule"], f["severity"]) for f in findings if f["field"] == field
            and f["rule"].startswith("model-")]


def test_a_missing_drafter_folder_is_an_error_naming_the_drafters_field(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "Kimi-K2.6")
    code, findings = _preflight("--models-dir", str(tmp_path))
    assert code == 1
    assert _on(findings, DRAFTER_FIELD) == [("model-path-missing", "error")]
    assert _on(findings, "engine.model_path") == [("model-files", "info")]
    (missing,) = [f for f in findings if f["rule"] == "model-path-missing"]
    assert "'/models/Kimi-K2.6-DFlash'" in missing["message"]


def test_folders_with_config_and_weights_pass(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "Kimi-K2.6")
    _checkpoint(tmp_path / "Kimi-K2.6-DFlash")
    _, findings = _preflight(env={"APPLIANCE_MODELS_DIR": str(tmp_path)})
    assert _on(findings, "engine.model_path") == [("model-files", "info")]
    assert _on(findings, DRAFTER_FIELD) == [("model-files", "info")]


def test_without_a_models_folder_it_says_the_folders_were_not_checked(tmp_path: Path) -> None:
    _, findings = _preflight("--models-dir", str(tmp_path / "nowhere"))
    not_checked = [f for f in findings if f["rule"] == "model-files-not-checked"]
    assert {f["field"] for f in not_checked} == {"engine.model_path", DRAFTER_FIELD}
    assert all(f["severity"] == "info" and f["message"].startswith("not checked:")
               for f in not_checked)
    assert "--models-dir" in not_checked[0]["fix"]
    assert not [f for f in findings if f["rule"] == "model-path-missing"]


