"""The suite must leave the work tree as it found it: no test rewrites a tracked file.

tests/conftest.py takes a snapshot of the tracked files' state when the session starts and
compares it when the session finishes; a difference fails the run and names the files.
It runs only under CI=true (or APPLIANCE_CHECK_WORKTREE=1): on a shared checkout other
people edit tracked files while a run is under way, and their edits would read as the
suite's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worktree_check_enabled() -> bool:
    asked = os.environ.get("CI", "").lower() == "true" or \
        os.environ.get("APPLIANCE_CHECK_WORKTREE", "") == "1"
    return asked and (ROOT / ".git").exists()  # an unpacked archive has no history to compare


def worktree_snapshot(*, root: Path = ROOT) -> dict[str, str]:
    """Each tracked file that differs from HEAD (modified, deleted, type change), with a hash
    of its content: a file already modified before the run must also stay as it was."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "-z"],
        cwd=root, capture_output=True, text=True, check=True).stdout
    entries = iter(out.split("\0"))
    snapshot: dict[str, str] = {}
    for entry in entries:
        if not entry:
            continue
        status, path = entry[:2], entry[3:]
        if "R" in status or "C" in status:
            next(entries, None)  # -z puts a rename's old path in an entry of its own
        file = root / path
        snapshot[path] = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else "-"
    return snapshot


def worktree_changes(*, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The tracked files whose state the run changed."""
    return sorted(path for path in before.keys() | after.keys()
                  if before.get(path) != after.get(path))
