"""The suite's own hygiene: the work tree guard (tests/worktree.py) sees a tracked file that
a run changed, and a test that returns a value fails instead of warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.worktree import ROOT, worktree_changes, worktree_snapshot


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   cwd=repo, check=True, capture_output=True)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "shot.png").write_bytes(b"before")
    (repo / "README.md").write_text("readme\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "start")
    return repo


def test_the_guard_names_a_tracked_file_the_run_rewrote(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    before = worktree_snapshot(root=repo)
    (repo / "docs" / "shot.png").write_bytes(b"after")
    (repo / "var.png").write_bytes(b"untracked: not the guard's business")
    assert worktree_changes(before=before, after=worktree_snapshot(root=repo)) == [
        "docs/shot.png"]


def test_the_guard_sees_a_file_modified_before_the_run_changed_again(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "README.md").write_text("someone's edit\n")
    before = worktree_snapshot(root=repo)
    assert worktree_changes(before=before, after=worktree_snapshot(root=repo)) == []
    (repo / "README.md").write_text("someone's edit, rewritten by a test\n")
    (repo / "docs" / "shot.png").unlink()
    assert worktree_changes(before=before, after=worktree_snapshot(root=repo)) == [
        "README.md", "docs/shot.png"]


def test_a_test_that_returns_a_value_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_returns.py").write_text("def test_returns():\n    return 42\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_returns.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout
    assert "PytestReturnNotNoneWarning" in run.stdout
