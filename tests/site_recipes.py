"""Site recipes for the build tests: a local git repository stands in for the SGLang source
(CI has no network to fetch SGLang) and the recipe YAML is written the way users write it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = "appliance-base:bookworm"
# A pip extra whose setup.py sleeps without a word, like a CUDA kernel compile: a build
# step that only a cancel which does not wait for output can stop promptly.
SLOW_SETUP = """\
import time
time.sleep(600)
from setuptools import setup
setup(name="slow-extra", version="0")
"""
SLOW_EXTRAS = '"--no-build-isolation", "--no-deps", "--no-index", "/opt/sglang/slow-extra"'


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True, capture_output=True, text=True,
    )
    return done.stdout.strip()


def commit_all(repo: Path, message: str = "source tree") -> str:
    """Make `repo` a git repository holding its files in one commit; returns the commit."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def engine_source_repo(root: Path, slow_extra: bool = False) -> Path:
    """<root>/sglang: the test engine's package as python/sglang, committed."""
    repo = root / "sglang"
    shutil.copytree(ROOT / "docker" / "test-engine" / "sglang", repo / "python" / "sglang")
    if slow_extra:
        (repo / "slow-extra").mkdir()
        (repo / "slow-extra" / "setup.py").write_text(SLOW_SETUP)
    commit_all(repo, "test engine as an SGLang source tree")
    return repo


def write_recipe(directory: Path, name: str, repo: Path, *, patches: Sequence[str] = (),
                 extras: str = "", base_image: str = BASE_IMAGE) -> Path:
    """<directory>/<name>.yaml for `repo` at its HEAD, installed offline (no dependencies)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nbase_image: {base_image}\n"
        f"sglang:\n  git: {repo}\n  ref: {git(repo, 'rev-parse', 'HEAD')}\n"
        "  flags: sglang-0.5.23\n"
        f"patches: [{', '.join(patches)}]\npip_extras: [{extras}]\n"
        "build_args:\n  SGLANG_INSTALL_DEPS: '0'\n"
    )
    return path
