"""Bring the real engine's Python packages at the versions of the flagship recipe's lock.

    python3 tests/gpu/realengine/build_carry.py OUTDIR [--only 433c58ed7|101cd5bd0]
        [--grammar] [--sglang-src DIR] [--lock LOCK] [--work DIR]
    python3 tests/gpu/realengine/build_carry.py OUTDIR --release 0.5.23 [--kernel VERSION]

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

`--release 0.5.23` builds OUTDIR/site523.tar.xz alone (with pydeps.tar.xz): the PyPI release
the DFLASH and baseline recipes pin, self-contained (no other site needed): sglang 0.5.23 and
the packages of NEEDED and GRAMMAR at the versions of its own lock
(`appliance/engine/locks/sglang-0.5.23.lock.txt`), a sglang-kernel, and the stubs, under
`site523/` and `stubs523/`. What the runs never load is left out (RELEASE_SKIPPED: the
diffusion server, the Rust HTTP/gRPC/bench/multimodal extensions, tests, type stubs).
The kernel is not the lock's: sglang-kernel 0.4.10 (and 0.4.7 to 0.4.9) pins torch 2.13.0 or
2.14.1, whose C++ ABI the GPU host's torch 2.11.0 lacks (0.4.10's sm90 common_ops links
`torch::Library::_def(..., std::vector<torch::headeronly::Tag>)` and the 6-argument
`c10::cuda::c10_cuda_check_implementation`, where 0.4.5, which loads on torch 2.11, links the
`at::Tag` and 5-argument ones), and torch 2.14.1 itself cannot travel. So the carry holds 0.4.5, the kernel
433c58ed7's runs load on that torch (`--kernel` chooses another); the runs set
SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (0.5.23 asks for 0.4.9 or later) and say so.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
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
# The PyPI release (`--release`): its lock, the wheel, and what its runs never load.
RELEASE_LOCKS = {"0.5.23": REPO / "appliance/engine/locks/sglang-0.5.23.lock.txt"}
# The sglang-kernel whose torch ABI is the GPU host's torch 2.11.0 (see the docstring).
RELEASE_KERNEL = "0.4.5"
RELEASE_SKIPPED = (
    "sglang/multimodal_gen/",  # the diffusion server
    "sglang/test/",
    "sglang/srt/rust_extensions/_server.",  # only with SGLANG_RUST_SERVER
    "sglang/srt/rust_extensions/_grpc.",  # only with --grpc-port
    "sglang/srt/rust_extensions/_bench.",  # sglang's own bench client
    "sglang/srt/rust_extensions/_multimodal.",  # image processors
)
RELEASE_SKIPPED_SUFFIXES = (".pyi",)
# What 0.5.23's runs reach inside functions, which the module-level import check misses (recorded
# 2026-12-06: tests/fixtures/real-engine/0.5.23/). The DFLASH worker's sampling prewarm JIT-builds
# tree_speculative_sampling_target_only with nvcc against flashinfer's headers: sglang's
# kernels/jit/utils/deps.py puts these folders of the installed flashinfer's `data/` on the include
# path and refuses to build unless each exists. The lock's flashinfer-python wheel (65 MB) brings
# its headers alone into the stub package (stubs523/flashinfer/data/, 2.8 MB xz'd): csrc/'s .cu
# sources, the bundled cccl (nvcc brings its own) and the Python package stay out.
RELEASE_JIT_HEADERS = {"flashinfer-python": (
    "flashinfer/data/include/", "flashinfer/data/csrc/", "flashinfer/data/cutlass/include/",
    "flashinfer/data/cutlass/tools/util/include/", "flashinfer/data/spdlog/include/")}
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".hh", ".inc", ".inl", ".ipp")
# The CUTLASS DSL (nvidia-cutlass-dsl 4.8.0, in the lock) does not travel: its native library
# (_cutlass_ir.cu13, 193 MB) is 50 MB xz'd, beside a 34 MiB site and a 17 MiB checkout in one
# device call's 64 MiB. A bf16 Qwen2/Qwen3/Llama MLP imports it (layers/dual_gemm.py) and runs it
# only on SM100; stubs523/cutlass (below HERE) lets the import pass and raises at any use.
RELEASE_STUBS = HERE / "stubs523"
PLATFORMS = ["manylinux_2_34_x86_64",  # sglang 0.5.23's own wheel
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
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


def unpack_wheels(wheels: list[Path], site: Path, skip: tuple[str, ...] = (),
                  skip_suffixes: tuple[str, ...] = ()) -> None:
    # A wheel is a zip laid out as site-packages: unzipping is installing with --no-deps.
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if not member.startswith(skip) and not member.endswith(skip_suffixes):
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


def build_release(work: Path, out: Path, release: str, kernel: str) -> Path:
    """site523.tar.xz: sglang `release` with its lock's packages, `kernel`, and the stubs."""
    pins = lock_pins(RELEASE_LOCKS[release])
    download(work / "rel-whl", wanted(pins, NEEDED + GRAMMAR) + [f"sglang=={pins['sglang']}"])
    download(work / "rel-kernel", [f"{KERNEL}=={kernel}"])
    site = work / "rel-site"
    unpack_wheels(sorted((work / "rel-whl").glob("*.whl")), site,
                  GRAMMAR_SKIPPED + RELEASE_SKIPPED, RELEASE_SKIPPED_SUFFIXES)
    unpack_wheels(sorted((work / "rel-kernel").glob("*.whl")), site, SKIPPED_KERNELS)
    shutil.rmtree(site / "bin", ignore_errors=True)
    stubs = work / "rel-stubs"
    for folder in (HERE / "stubs", RELEASE_STUBS):
        shutil.copytree(folder, stubs, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    jit_headers(work / "rel-headers", stubs, pins)
    tag = release.replace(".", "")[-3:]
    name = out / f"site{tag}.tar.xz"
    pack(name, {f"site{tag}": site, f"stubs{tag}": stubs})
    return site


def jit_headers(dest: Path, stubs: Path, pins: dict[str, str]) -> None:
    """RELEASE_JIT_HEADERS: each package's header folders, into the stub package of its name."""
    download(dest, wanted(pins, list(RELEASE_JIT_HEADERS)))
    for wheel in sorted(dest.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for folders in RELEASE_JIT_HEADERS.values():
                for member in archive.namelist():
                    if member.startswith(folders) and member.endswith(HEADER_SUFFIXES):
                        archive.extract(member, stubs)
                for folder in folders:  # each must exist, whether or not it holds headers
                    (stubs / folder).mkdir(parents=True, exist_ok=True)


# Import names the GPU host's image has (the device README's package list), for the check.
HOST_MODULES = frozenset({
    "torch", "triton", "numpy", "aiohttp", "requests", "psutil", "packaging", "yaml", "PIL",
    "safetensors", "huggingface_hub", "tqdm", "filelock", "fsspec", "jinja2", "sentencepiece",
    "tiktoken", "einops", "prometheus_client", "uvloop", "scipy", "msgpack", "xxhash", "cuda",
    "numba", "llvmlite", "ninja", "setuptools", "pkg_resources", "anyio", "httpx", "h11",
    "idna", "certifi", "click", "rich", "typer", "pyarrow", "pandas", "sympy", "networkx",
    "google", "cupy", "nvidia", "six", "dateutil", "attr", "attrs", "wrapt", "frozenlist",
    "multidict", "yarl", "aiosignal", "propcache", "markupsafe", "charset_normalizer",
    "urllib3", "pynvml", "cv2", "torchvision", "torchaudio", "timm", "pydantic_core",
    "hf_xet", "zipp", "importlib_metadata", "pygments", "markdown_it", "mdurl", "shellingham",
    "mpmath", "typing_inspect", "mypy_extensions", "cloudpickle", "tabulate", "portalocker",
    "sortedcontainers", "xarray", "jax", "jaxlib", "onnx", "pybind11", "cmake", "regex",
})


# Where the engine's serving road starts (launch_server imports most of it inside functions):
# the server, the scheduler, the model runner, the runs' models and backends.
ENTRIES = (
    "sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager", "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.deepseek_v2", "sglang.srt.models.qwen3", "sglang.srt.models.dflash",
    "sglang.srt.speculative.dflash_worker_v2", "sglang.srt.speculative.dflash_utils",
    "sglang.srt.constrained.xgrammar_backend", "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.entrypoints.openai.serving_chat",
)
# Packages the serving road names at module level only behind a switch the runs leave off:
# not carried, and not reported missing.
SWITCHED_OFF = {
    "deep_gemm": "imported where ENABLE_JIT_DEEPGEMM, which is false when its import fails",
    "modelscope": "imported only with SGLANG_USE_MODELSCOPE",
    "zstandard": "imported only with SGLANG_ENABLE_REQUEST_DECOMPRESSION",
}
# A module-level `if` on another platform (or on type checking) is not the CUDA host's road.
OTHER_PLATFORMS = ("hip", "npu", "xpu", "musa", "cpu", "mps", "mlx", "TYPE_CHECKING", "aiter",
                   "amx", "darwin", "hpu")


def _module_imports(module: str, path: Path, body: list[ast.stmt]) -> Iterator[str]:
    """The modules `body` imports at module level, into the CUDA host's `if` branches and the
    `try` blocks that do not catch a missing module."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                name = node.module
            else:
                parts = module.split(".")
                keep = len(parts) - node.level + (path.name == "__init__.py")
                anchor = ".".join(parts[:keep])
                name = f"{anchor}.{node.module}" if node.module else anchor
            yield name
            yield from (f"{name}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if not any(word in test for word in OTHER_PLATFORMS):
                yield from _module_imports(module, path, node.body)
            if not test.startswith("not "):
                yield from _module_imports(module, path, node.orelse)
        elif isinstance(node, ast.Try) and not any(_catches_import_error(h) for h in node.handlers):
            yield from _module_imports(module, path, node.body)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = ast.unparse(handler.type) if handler.type is not None else "BaseException"
    return any(name in caught for name in ("ImportError", "ModuleNotFoundError", "Exception"))


def import_check(site: Path, entries: tuple[str, ...] = ENTRIES) -> dict[str, list[str]]:
    """The third-party packages that the module-level imports from `entries` name (read from
    the unpacked site's sources; imports inside functions and guarded by a `try` left aside),
    each with up to three modules that import it, that neither the site, the stubs nor the
    host's image hold."""
    stubs = {path.name for folder in (HERE / "stubs", RELEASE_STUBS) for path in folder.iterdir()}
    present = {path.name.split(".")[0] for path in site.iterdir()} | stubs | HOST_MODULES
    present |= set(sys.stdlib_module_names) | set(SWITCHED_OFF)
    own = {entry.split(".")[0] for entry in entries}
    seen: set[str] = set()
    todo = list(entries)
    missing: dict[str, list[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        base = site / module.replace(".", "/")
        path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for name in _module_imports(module, path, tree.body):
            root = name.split(".")[0]
            if root in own:
                todo.append(name)
            elif root not in present:
                missing.setdefault(root, []).append(module)
    return {root: sorted(set(users))[:3] for root, users in sorted(missing.items())}


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
    parser.add_argument("--release", choices=sorted(RELEASE_LOCKS),
                        help="build only site<release>.tar.xz (and pydeps.tar.xz): that PyPI release")
    parser.add_argument("--kernel", default=RELEASE_KERNEL,
                        help=f"--release: the sglang-kernel version (default {RELEASE_KERNEL}: the "
                             "host torch's ABI)")
    args = parser.parse_args()
    pins = lock_pins(args.lock)
    out = args.outdir.resolve()
    if args.work and out in (args.work.resolve(), *args.work.resolve().parents):
        raise SystemExit("--work must lie outside OUTDIR: OUTDIR holds only what travels")
    out.mkdir(parents=True, exist_ok=True)
    sites = [args.only] if args.only else sorted(SITES, reverse=True)
    if args.release:
        sites = []
    with tempfile.TemporaryDirectory(prefix="rig-carry-") as scratch:
        work = args.work or Path(scratch)
        if args.release:
            site = build_release(work, out, args.release, args.kernel)
            missing = import_check(site)
            print(f"{args.release}: the module-level imports from {len(ENTRIES)} of the engine's "
                  "modules name " + (f"packages neither carried nor on the host: {missing}"
                                     if missing else "only packages carried or on the host")
                  + f" (left out, switched off: {', '.join(sorted(SWITCHED_OFF))})")
        if "433c58ed7" in sites:
            build_433(work, out, pins)
        if "101cd5bd0" in sites:
            build_101(work, out)
        if args.grammar and not args.release:
            build_grammar(work, out, pins)
        build_pydeps(work, out)
        if args.work:
            shutil.rmtree(args.work, ignore_errors=True)
    if args.sglang_src and sites:
        copy_sources(args.sglang_src, out, [SITES[name] for name in sites])
    total = 0
    for path in sorted(out.iterdir()):
        total += path.stat().st_size
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    checkout = checkout_bytes()
    if checkout is not None:
        print(f"checkout {checkout / 2**20:.1f} MiB + {out.name} {total / 2**20:.1f} MiB = "
              f"{(checkout + total) / 2**20:.1f} MiB of a device call's 64 MiB")


def checkout_bytes() -> int | None:
    """What a device call sends of the checkout: tracked and untracked-not-ignored files."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = (REPO / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


if __name__ == "__main__":
    main()
