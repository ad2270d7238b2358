"""Bring the real engine's Python packages at the versions of the flagship recipe's lock.

    python3 tests/gpu/realengine/build_carry.py OUTDIR [--lock LOCK]

Run where PyPI is reachable. It downloads, for CPython 3.12 on x86-64 Linux, every package
the real engine needs that a GPU host with torch (CUDA 13) typically lacks, each at the version
the lock (`appliance/engine/locks/kimi-k2.6-ddtree.lock.txt`) pins, and packs them with the
stubs into OUTDIR/site.tar.xz. A GPU host with network can skip this: `real-engine.sh` then
installs the same pins with pip. OUTDIR/site101.tar.xz holds the sglang-kernel 101cd5bd0 needs.

Kernels the rig's runs never load are left out of sglang-kernel so that the bundle fits one
device call (64 MiB): flash_ops (FA3, 1.1 GB; imported lazily by `sgl_kernel.flash_attn`),
flashmla_ops, infllm_ops and the SM100 build. The fa3 runs need flash_ops: see README.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LOCK = REPO / "appliance/engine/locks/kimi-k2.6-ddtree.lock.txt"

# What the engine imports that the GPU host's image lacks or holds at another version
# (found with the probe's import tracer: ../shared/real-engine/tools/trace_missing.py).
NEEDED = [
    "transformers", "tokenizers", "regex", "typing-extensions", "pydantic", "pydantic-core",
    "annotated-types", "typing-inspection", "fastapi", "starlette", "opentelemetry-api", "uvicorn",
    "python-multipart", "pyzmq", "orjson", "msgspec", "setproctitle", "pybase64", "interegular",
    "partial-json-parser", "dill", "openai", "jiter", "distro", "sniffio", "compressed-tensors",
    "loguru", "gguf", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
    "soundfile", "cffi", "pycparser", "apache-tvm-ffi",
]
# Not in the lock at all: the lock's image builds them elsewhere; pinned here, said here.
OUTSIDE_LOCK: dict[str, str] = {}
KERNEL = "sglang-kernel"
# 101cd5bd0 imports moe_fused_gate, which sglang-kernel 0.4.5 dropped: it needs 0.4.3.
KERNEL_101 = "0.4.3"
SKIPPED_KERNELS = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
                   "sgl_kernel/infllm_ops", "sgl_kernel/sm100/")
# 0.4.3's bundled libraries and headers: 101cd5bd0's crash comes before it could use them.
SKIPPED_101 = SKIPPED_KERNELS + ("lib/", "lib64/", "include/", "_mscclpp")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64"]


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", line)
        if found:
            pins[found.group(1).lower().replace("_", "-")] = found.group(2)
    return pins


def wanted(pins: dict[str, str]) -> list[str]:
    missing = [name for name in NEEDED if name not in pins and name not in OUTSIDE_LOCK]
    if missing:
        raise SystemExit(f"not in the lock and not pinned in OUTSIDE_LOCK: {missing}")
    return [f"{name}=={pins.get(name) or OUTSIDE_LOCK[name]}" for name in NEEDED]


def download(dest: Path, specs: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + specs, check=True)


def unpack_wheels(wheels: list[Path], site: Path, skip: tuple[str, ...] = ()) -> None:
    # A wheel is a zip laid out as site-packages: unzipping is installing with --no-deps.
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if not member.startswith(skip):
                    archive.extract(member, site)


def pack(out: Path, folders: dict[str, Path]) -> None:
    with tarfile.open(out, "w:xz", preset=9) as archive:
        for name, folder in folders.items():
            archive.add(folder, arcname=name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args()
    pins = lock_pins(args.lock)
    work = args.outdir / "work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "whl").mkdir(parents=True)
    (work / "kernel").mkdir()
    (work / "kernel101").mkdir()
    download(work / "whl", wanted(pins))
    download(work / "kernel", [f"{KERNEL}=={pins[KERNEL]}"])
    download(work / "kernel101", [f"{KERNEL}=={KERNEL_101}"])
    site, site101 = work / "site", work / "site101"
    unpack_wheels(sorted((work / "whl").glob("*.whl")), site)
    unpack_wheels(sorted((work / "kernel").glob("*.whl")), site, SKIPPED_KERNELS)
    unpack_wheels(sorted((work / "kernel101").glob("*.whl")), site101, SKIPPED_101)
    for folder in (site, site101):
        shutil.rmtree(folder / "bin", ignore_errors=True)
    pack(args.outdir / "site.tar.xz", {"site": site, "stubs": HERE / "stubs"})
    pack(args.outdir / "site101.tar.xz", {"site101": site101, "stubs101": HERE / "stubs101"})
    for name in ("site.tar.xz", "site101.tar.xz"):
        print(f"{args.outdir / name}: {(args.outdir / name).stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
