"""The rig's sglang 0.5.23 phase (tests/gpu/realengine: `refusals523`) on the CPU: its runs start
the release from its own site with the kernel-check skip said in their changes, the phase names
only runs that exist, and build_carry.py's import check names a package the carry lacks and
nothing it holds. No GPU, no network: the device call is the one place these run for real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
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
        # What the rig gives beyond the release's image is said in the run's changes.
        assert any(change.startswith("cutlass: the rig's stub") for change in plan["changes"])
        assert any("flashinfer-python 0.7.2's JIT headers" in change for change in plan["changes"])
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


def test_the_release_carry_brings_flashinfers_jit_headers_and_nothing_else(
        rig: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_carry = rig["build_carry"]
    members = {
        "flashinfer/__init__.py": "", "flashinfer/sampling.py": "",
        "flashinfer/data/include/flashinfer/sampling.cuh": "#pragma once",
        "flashinfer/data/csrc/sampling_utils.h": "#pragma once",
        "flashinfer/data/csrc/sampling.cu": "__global__ void k() {}",
        "flashinfer/data/cutlass/include/cute/tensor.hpp": "#pragma once",
        "flashinfer/data/cutlass/examples/readme.md": "",
        "flashinfer/data/cccl/cub/cub.cuh": "#pragma once",
    }

    def download(dest: Path, specs: list[str]) -> None:
        assert specs == ["flashinfer-python==0.7.2"]
        dest.mkdir(parents=True)
        with zipfile.ZipFile(dest / "flashinfer_python-0.7.2-py3-none-any.whl", "w") as wheel:
            for name, text in members.items():
                wheel.writestr(name, text)

    monkeypatch.setattr(build_carry, "download", download)
    stubs = tmp_path / "stubs"
    build_carry.jit_headers(tmp_path / "headers", stubs, {"flashinfer-python": "0.7.2"})
    carried = sorted(str(path.relative_to(stubs)) for path in stubs.rglob("*") if path.is_file())
    assert carried == ["flashinfer/data/csrc/sampling_utils.h",
                       "flashinfer/data/cutlass/include/cute/tensor.hpp",
                       "flashinfer/data/include/flashinfer/sampling.cuh"]
    # sglang's JIT refuses to build unless each folder it puts on the include path exists.
    for folder in ("include", "csrc", "cutlass/include", "cutlass/tools/util/include",
                   "spdlog/include"):
        assert (stubs / "flashinfer" / "data" / folder).is_dir(), folder


def test_the_cutlass_stub_lets_the_dual_gemm_module_import_and_refuses_any_use() -> None:
    """sglang 0.5.23's cutedsl_dual_gemm.py imports these names and decorates its kernels at
    import; a bf16 Qwen3 MLP imports it on any CUDA GPU and runs it only on SM100."""
    program = """
import cutlass
import cutlass.cute as cute
from cutlass.cute import experimental as cute_ext
from cutlass.cute.nvgpu import tcgen05
from cutlass.cute.runtime import from_dlpack
from cutlass.utils import blackwell_helpers as sm100_utils

@cute.experimental.jit
def kernel(x: cute.Tensor) -> None:
    pass

assert not hasattr(cutlass, "__version__")  # no dunder name resolves: it is no real package
refused = []
for use in (lambda: kernel(1), lambda: from_dlpack(1), lambda: cute.ceil_div(3, 2),
            lambda: cutlass.BFloat16, lambda: tcgen05.OperandMajorMode.K(1)):
    try:
        use()
    except RuntimeError as error:
        refused.append(str(error))
print(len(refused))
print(refused[0])
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False, env={"PYTHONPATH": str(RIG / "stubs523")})
    assert done.returncode == 0, done.stderr
    count, first = done.stdout.splitlines()
    # cutlass.BFloat16 is a name, not a use: only the four calls raise.
    assert count == "4"
    assert first.startswith("cutlass.cute.experimental.jit(kernel): the CUTLASS DSL is a rig stub")
