"""The patch manifest and the mechanism the engine build uses to apply patches
(docker/engine/tools/apply_patches.py), on a small git repository made here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from appliance.images.plan import PATCHES_DIR

APPLIER = Path(__file__).resolve().parents[3] / "docker" / "engine" / "tools" / "apply_patches.py"
REQUIRED = {"name", "file", "fixes", "applies_to", "verify"}

needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")


def manifest() -> list[dict]:
    return yaml.safe_load((PATCHES_DIR / "manifest.yaml").read_text())["patches"]


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True)
    return proc.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """python/sglang/runner.py in a git repo, and three patches against it in patches/."""
    root = tmp_path / "src"
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    runner = pkg / "runner.py"
    runner.write_text("".join(f"line {i}\n" for i in range(1, 21)))
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    patches = tmp_path / "patches"
    patches.mkdir()
    text = runner.read_text()
    runner.write_text(text.replace("line 3\n", "line three\n").replace("line 17\n", "seventeen\n"))
    good = git(root, "diff")
    (patches / "good.patch").write_text(good)
    git(root, "checkout", "-q", "--", ".")
    # Same patch, second hunk's context no longer matches the source.
    (patches / "stale.patch").write_text(good.replace(" line 15\n", " line fifteen\n"))
    (patches / "missing.patch").write_text(good.replace("runner.py", "gone.py"))
    return tmp_path


def apply(tmp: Path, *names: str) -> subprocess.CompletedProcess[str]:
    series = tmp / "series"
    series.write_text("".join(f"{n}\n" for n in names))
    argv = [sys.executable, str(APPLIER), "--series", str(series), "--patches-dir",
            str(tmp / "patches"), "--source-root", str(tmp / "src")]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def failure_of(proc: subprocess.CompletedProcess[str]) -> dict:
    line = next(x for x in proc.stdout.splitlines() if x.startswith("APPLIANCE_PATCH_FAILED"))
    return json.loads(line.split(" ", 1)[1])


def test_the_manifest_lists_each_patch_with_what_it_fixes_where_and_how_to_verify() -> None:
    entries = manifest()
    assert entries, "the manifest lists at least one patch"
    for entry in entries:
        assert set(entry) >= REQUIRED, f"{entry.get('name')}: missing {REQUIRED - set(entry)}"
        assert (PATCHES_DIR / entry["file"]).is_file()
        assert entry["fixes"]["symptom"] and entry["fixes"]["error"]
        for source in entry["applies_to"]:
            assert source["source"] and len(source["commit"]) == 40
        assert entry["verify"]
    assert len({e["name"] for e in entries}) == len(entries)


def test_every_patch_file_in_the_directory_is_in_the_manifest() -> None:
    listed = {e["file"] for e in manifest()}
    assert {p.name for p in PATCHES_DIR.glob("*.patch")} == listed


def test_the_ddtree_patch_touches_the_verify_width_in_every_place_the_issue_names() -> None:
    entry = next(e for e in manifest() if e["name"] == "ddtree-verify-graph-width")
    text = (PATCHES_DIR / entry["file"]).read_text()
    touched = {line.split(" b/", 1)[1] for line in text.splitlines()
               if line.startswith("diff --git ")}
    srt = "python/sglang/srt/"
    for path in ("model_executor/cuda_graph_runner.py", "model_executor/model_runner.py",
                 "server_args.py", "layers/attention/triton_backend.py",
                 "layers/attention/flashattention_backend.py",
                 "layers/attention/flashmla_backend.py",
                 "layers/attention/trtllm_mla_backend.py"):
        assert srt + path in touched
    assert "max_speculative_num_draft_tokens" in text
    assert entry["applies_to"][0]["commit"].startswith("101cd5bd0")


@needs_patch
def test_a_patch_that_fits_is_applied_after_its_dry_run(repo: Path) -> None:
    proc = apply(repo, "good.patch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied good.patch" in proc.stdout
    text = (repo / "src" / "python" / "sglang" / "runner.py").read_text()
    assert "line three\n" in text and "seventeen\n" in text


@needs_patch
def test_a_stale_hunk_fails_naming_the_patch_the_file_and_the_hunk_and_changes_nothing(
    repo: Path,
) -> None:
    before = (repo / "src" / "python" / "sglang" / "runner.py").read_text()
    proc = apply(repo, "stale.patch")
    assert proc.returncode == 1
    assert failure_of(proc) == {"patch": "stale.patch", "file": "python/sglang/runner.py",
                                "hunk": 2, "line": 14}
    assert "Hunk #2 FAILED" in proc.stdout
    assert "stale.patch does not apply: file python/sglang/runner.py, hunk #2" in proc.stderr
    # The dry run stopped it: hunk #1 would have fitted, but nothing was written.
    assert (repo / "src" / "python" / "sglang" / "runner.py").read_text() == before


@needs_patch
def test_a_patch_for_a_missing_file_names_that_file(repo: Path) -> None:
    proc = apply(repo, "missing.patch")
    assert proc.returncode == 1
    detail = failure_of(proc)
    assert detail["patch"] == "missing.patch"
    assert detail["file"] == "python/sglang/gone.py"
    assert detail["reason"] == "file to patch not found"


@needs_patch
def test_patches_apply_in_the_order_the_series_lists_them(repo: Path) -> None:
    runner = repo / "src" / "python" / "sglang" / "runner.py"
    git(repo / "src", "checkout", "-q", "--", ".")
    runner.write_text(runner.read_text().replace("line three\n", "line 3\n"))
    second = repo / "patches" / "second.patch"
    # second.patch only fits once good.patch has turned line 3 into "line three".
    second.write_text((repo / "patches" / "good.patch").read_text()
                      .replace("-line 3\n+line three\n", "-line three\n+line III\n")
                      .replace("-line 17\n+seventeen\n", "-seventeen\n+XVII\n"))
    assert apply(repo, "second.patch", "good.patch").returncode == 1
    git(repo / "src", "checkout", "-q", "--", ".")
    proc = apply(repo, "good.patch", "second.patch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "line III\n" in runner.read_text()
