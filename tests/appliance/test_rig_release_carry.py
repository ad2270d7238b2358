"""The rig's sglang 0.5.23 phase (tests/gpu/realengine: `refusals523`) on the CPU: its runs start
the release from its own site with the kernel-check skip said in their changes, the phase names
only runs that exist, and build_carry.py's import check names a package the carry lacks and
nothing it holds. No GPU, no network: the device call is the one place these run for real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RIG = ROOT / "tests" / "gpu" / "realengine"


@pytest.fixture(scope="module")
def rig() -> Iterator[dict[str, ModuleType]]:
    sys.path.insert(0, str(RIG))
    try:
        import build_carry
        import runs
        yield {"runs": runs, "build_carry": build_carry}
    finally:
        sys.path.remove(str(RIG))


def test_the_phase_names_only_release_runs_that_exist(rig: dict[str, ModuleType]) -> None:
    script = (ROOT / "tests/gpu/real-engine.sh").read_text()
    found = re.search(r'refusals523\) waves="([^"]+)"', script)
    assert found, "real-engine.sh has no refusals523 phase"
    names = found.group(1).replace(",", " ").split()
    assert sorted(names) == sorted(rig["runs"].R523_RUNS)
    for name in names:
        run = rig["runs"].RUNS[name]
        assert run.source == rig["runs"].R523 and run.refusals and run.grammar
        assert run.pythonpath == ("site523", "stubs523")


def test_the_dry_run_prints_the_release_argv_with_its_changes() -> None:
    done = subprocess.run([sys.executable, str(RIG / "record.py"), "--dry-run",
                           "refusals523_dflash", "refusals523_trained"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
                          env={"RIG_STASH": "/stash", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    plans = [json.loads(chunk) for chunk in re.split(r"(?m)^(?=\{)", done.stdout) if chunk.strip()]
    assert [plan["run"] for plan in plans] == ["refusals523_dflash", "refusals523_trained"]
    for plan in plans:
        argv = plan["argv"]
        assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
        assert "--grammar-backend" not in argv  # xgrammar travels in site523
        assert plan["pythonpath"] == "/stash/site523:/stash/stubs523"
        assert plan["env_added"]["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"
        assert any("sglang-kernel 0.4.5" in change for change in plan["changes"])
    assert plans[1]["argv"][plans[1]["argv"].index("--model-path") + 1] == "/stash/models/trained-target"


def test_the_import_check_names_what_the_carry_lacks(rig: dict[str, ModuleType],
                                                    tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "carried").mkdir()
    (site / "carried" / "__init__.py").write_text("")
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(
        "import os\nimport torch\nfrom sglang.srt import server\n")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server.py").write_text(
        "import carried\nfrom .helpers import x\nfrom missing_pkg.sub import thing\n"
        "def later():\n    import lazily_missing\n")
    (site / "sglang" / "srt" / "helpers.py").write_text("import also_missing\n")
    missing = rig["build_carry"].import_check(site)
    assert missing == {"also_missing": ["sglang.srt.helpers"],
                       "missing_pkg": ["sglang.srt.server"]}
