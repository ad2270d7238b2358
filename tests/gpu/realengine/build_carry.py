"""Bring the real engine's Python packages at the versions of the flagship recipe's lock.

    python3 tests/gpu/realengine/build_carry.py OUTDIR [--only 433c58ed7|101cd5bd0]
        [--grammar] [--sglang-src DIR] [--lock LOCK] [--work DIR]

Run where PyPI is reachable. It downloads, for CPython 3.12 on x86-64 Linux, every package
the real engine needs that a GPU host with torch (CUDA 13) typically lacks, each at the version
the lock (`appliance/engine/locks/kimi-k2.6-ddtree.lock.txt`) pins, and packs them with the
stubs into OUTDIR/site.tar.xz (433c58ed7's site). OUTDIR/site101.tar.xz holds the
sglang-kernel 101cd5bd0 needs. `--only` builds one of the two. `--grammar` adds
OUTDIR/grammar.tar.xz: xgrammar at the lock's version, which unpacks into the same site
(runs that send grammar requests need it). OUTDIR/pydeps.tar.xz always: what the rig's own
driver imports through the checkout's `appliance` that the host lacks (the Docker SDK). `--sglang-src DIR` copies the SGLang source
snapshots the built sites run (`sglang-<commit>.tar.gz`) from DIR (`../shared/sglang-src`)
into OUTDIR, so that OUTDIR alone is what a GPU host without `../shared` needs.

OUTDIR receives only those archives: the wheels and unpacked sites are made in a work folder
outside it (`--work`, else a temporary folder), removed at the end, so OUTDIR can be carried as
it is (a device call carries at most 64 MiB with the checkout).

Kernels the rig's runs never load are left out of sglang-kernel so that the bundle fits one
device call: flash_ops (FA3, 1.1 GB; imported lazily by `sgl_kernel.flash_attn`),
flashmla_ops, infllm_ops and the SM100 build. The fa3 runs need flash_ops: see README.md.
xgrammar's static library and headers (only for building against it) are left out too.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LOCK = REPO / "appliance/engine/locks/kimi-k2.6-ddtree.lock.txt"
S433 = "433c58ed70cd1dabe5a07a83da12f1513cd599ae"
S101 = "101cd5bd02faab336ada94f78daada6288c1816e"
SITES = {"433c58ed7": S433, "101cd5bd0": S101}

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
# The grammar backend the product's argv leaves at SGLang's default (its needs, pydantic,
# apache-tvm-ffi, torch, transformers, triton, numpy, are in NEEDED or on the host).
GRAMMAR = ["xgrammar"]
GRAMMAR_SKIPPED = ("xgrammar/lib/", "xgrammar/include/")
# What the rig's own driver (record.py, through the checkout's `appliance` package) imports that
# the GPU host lacks, at the project's own pins (pyproject.toml): pydeps.tar.xz.
PYDEPS = {"docker": "7.2.0"}
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


def wanted(pins: dict[str, str], names: list[str]) -> list[str]:
    missing = [name for name in names if name not in pins and name not in OUTSIDE_LOCK]
    if missing:
        raise SystemExit(f"not in the lock and not pinned in OUTSIDE_LOCK: {missing}")
    return [f"{name}=={pins.get(name) or OUTSIDE_LOCK[name]}" for name in names]


def download(dest: Path, specs: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
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


def build_433(work: Path, out: Path, pins: dict[str, str]) -> None:
    download(work / "whl", wanted(pins, NEEDED))
    download(work / "kernel", [f"{KERNEL}=={pins[KERNEL]}"])
    site = work / "site"
    unpack_wheels(sorted((work / "whl").glob("*.whl")), site)
    unpack_wheels(sorted((work / "kernel").glob("*.whl")), site, SKIPPED_KERNELS)
    shutil.rmtree(site / "bin", ignore_errors=True)
    pack(out / "site.tar.xz", {"site": site, "stubs": HERE / "stubs"})


def build_101(work: Path, out: Path) -> None:
    download(work / "kernel101", [f"{KERNEL}=={KERNEL_101}"])
    site101 = work / "site101"
    unpack_wheels(sorted((work / "kernel101").glob("*.whl")), site101, SKIPPED_101)
    shutil.rmtree(site101 / "bin", ignore_errors=True)
    pack(out / "site101.tar.xz", {"site101": site101, "stubs101": HERE / "stubs101"})


def build_grammar(work: Path, out: Path, pins: dict[str, str]) -> None:
    download(work / "grammar", wanted(pins, GRAMMAR))
    site = work / "grammar-site"
    unpack_wheels(sorted((work / "grammar").glob("*.whl")), site, GRAMMAR_SKIPPED)
    pack(out / "grammar.tar.xz", {"site": site})


def build_pydeps(work: Path, out: Path) -> None:
    download(work / "pydeps", [f"{name}=={version}" for name, version in PYDEPS.items()])
    site = work / "pydeps-site"
    unpack_wheels(sorted((work / "pydeps").glob("*.whl")), site)
    pack(out / "pydeps.tar.xz", {"pydeps": site})


def copy_sources(src_dir: Path, out: Path, commits: list[str]) -> None:
    for commit in commits:
        name = f"sglang-{commit}.tar.gz"
        if not (src_dir / name).is_file():
            raise SystemExit(f"{src_dir / name} not found: pass --sglang-src the folder that holds it")
        shutil.copyfile(src_dir / name, out / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--only", choices=sorted(SITES), help="build only this source's site")
    parser.add_argument("--grammar", action="store_true", help="also grammar.tar.xz (xgrammar)")
    parser.add_argument("--sglang-src", type=Path, help="copy the SGLang snapshots from here")
    parser.add_argument("--work", type=Path, help="work folder (default: a temporary one)")
    args = parser.parse_args()
    pins = lock_pins(args.lock)
    out = args.outdir.resolve()
    if args.work and out in (args.work.resolve(), *args.work.resolve().parents):
        raise SystemExit("--work must lie outside OUTDIR: OUTDIR holds only what travels")
    out.mkdir(parents=True, exist_ok=True)
    sites = [args.only] if args.only else sorted(SITES, reverse=True)
    with tempfile.TemporaryDirectory(prefix="rig-carry-") as scratch:
        work = args.work or Path(scratch)
        if "433c58ed7" in sites:
            build_433(work, out, pins)
        if "101cd5bd0" in sites:
            build_101(work, out)
        if args.grammar:
            build_grammar(work, out, pins)
        build_pydeps(work, out)
        if args.work:
            shutil.rmtree(args.work, ignore_errors=True)
    if args.sglang_src:
        copy_sources(args.sglang_src, out, [SITES[name] for name in sites])
    for path in sorted(out.iterdir()):
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
