"""The flagship recipe's SGLang source, for real: the pinned commit's snapshot from
../shared/sglang-src/ is packed into a build context exactly as the image build packs it,
the recipe's patch set is applied with the build's own applier, every patched file compiles,
the shipped flag list is that source's, and the DDTree pieces that run without a GPU (argument
handling, verify widths per role, tree building and mask compiling) run on CPU tensors."""

from __future__ import annotations

import io
import json
import os
import py_compile
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from appliance.engine.flags import load_flags
from appliance.engine.recipes import Recipe, SGLangSource, load_recipe
from appliance.images.plan import plan_build

ROOT = Path(__file__).resolve().parents[3]
SNAPSHOTS = Path(os.environ.get("APPLIANCE_SGLANG_SRC_DIR", ROOT.parent / "shared" / "sglang-src"))
APPLIER = ROOT / "docker" / "engine" / "tools" / "apply_patches.py"
PROBE = Path(__file__).with_name("sglang_probe.py")
FLAGSHIP = load_recipe("kimi-k2.6-ddtree")
DDTREE_FLAGS = {"--speculative-ddtree-budget", "--speculative-ddtree-block-size",
                "--speculative-ddtree-cuda-graph-buckets", "--speculative-draft-attention-backend"}


def snapshot_recipe() -> Recipe:
    """The flagship recipe with its git source swapped for the snapshot of the same commit,
    as a site without network writes it."""
    ref = FLAGSHIP.sglang.ref or ""
    archive = SNAPSHOTS / f"sglang-{ref}.tar.gz"
    if not archive.is_file():
        pytest.skip(f"no snapshot of the pinned commit {ref[:9]}: {archive} is absent "
                    "(the shared SGLang source snapshots are not on this machine)")
    source = replace(FLAGSHIP.sglang, git=None, archive=str(archive))
    return replace(FLAGSHIP, sglang=source)


@pytest.fixture(scope="module")
def context() -> dict[str, bytes]:
    return plan_build(snapshot_recipe(), gpucheck=None).files


@pytest.fixture(scope="module")
def patched(context: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The context's source tree unpacked and the context's patch series applied to it,
    both as the image build does (fetch-sglang.sh, then apply_patches.py)."""
    work = tmp_path_factory.mktemp("sglang-source")
    tree = work / "sglang"
    with tarfile.open(fileobj=io.BytesIO(context["src/sglang.tar"])) as tar:
        tar.extractall(tree, filter="data")
    patches = work / "patches"
    patches.mkdir()
    for name, data in context.items():
        if name.startswith("patches/"):
            (patches / name.removeprefix("patches/")).write_bytes(data)
    proc = subprocess.run([sys.executable, str(APPLIER), "--series", str(patches / "series"),
                           "--patches-dir", str(patches), "--source-root", str(tree)],
                          capture_output=True, text=True, check=False)
    series = [x for x in (patches / "series").read_text().splitlines() if x.strip()]
    return {"tree": tree, "proc": proc, "series": series}


def test_the_context_holds_the_pinned_commit_and_the_recipes_patch_series(
        context: dict[str, bytes]) -> None:
    assert context["src/sglang.ref"].decode().strip().endswith(FLAGSHIP.sglang.ref or "-")
    series = context["patches/series"].decode().split()
    assert series == [Path(p).name for p in series]
    assert len(series) == len(FLAGSHIP.patches)
    with tarfile.open(fileobj=io.BytesIO(context["src/sglang.tar"])) as tar:
        names = set(tar.getnames())
    assert "python/sglang/srt/speculative/ddtree_utils.py" in names
    assert "python/pyproject.toml" in names


def test_the_patch_set_applies_cleanly_as_the_build_applies_it(patched: dict[str, Any]) -> None:
    proc = patched["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "APPLIANCE_PATCH_FAILED" not in proc.stdout
    for name in patched["series"]:
        assert name in proc.stdout, f"the applier did not report {name}"


def _patched_files(patched: dict[str, Any]) -> list[Path]:
    files = [line.split()[-1] for line in patched["proc"].stdout.splitlines()
             if line.startswith("patching file")]
    return [patched["tree"] / f.strip("'") for f in files]


def test_every_patched_file_and_every_ddtree_module_compiles(patched: dict[str, Any]) -> None:
    srt = patched["tree"] / "python" / "sglang" / "srt"
    ddtree = sorted(srt.glob("speculative/ddtree*.py"))
    assert len(ddtree) >= 4, "the pinned source has no DDTree modules"
    targets = sorted(set(_patched_files(patched)) | set(ddtree))
    assert len(_patched_files(patched)) >= len(patched["series"])
    for path in targets:
        py_compile.compile(str(path), doraise=True, cfile=str(path) + ".pyc-test")


def test_the_shipped_flag_list_is_the_pinned_sources(patched: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gen_sglang_flags import collect_flags_from_source
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from_source = set(collect_flags_from_source(patched["tree"] / "python"))
    name = FLAGSHIP.flag_list_name
    assert name is not None and name.endswith(FLAGSHIP.sglang.ref[:9] if FLAGSHIP.sglang.ref else "")
    shipped = load_flags(name)
    assert shipped is not None
    assert from_source == set(shipped), (sorted(from_source - shipped),
                                         sorted(shipped - from_source))
    assert shipped >= DDTREE_FLAGS


def test_a_site_recipe_pinning_the_same_commit_gets_the_same_knowledge() -> None:
    site = Recipe(name="my-site-kimi", base_image="x",
                  sglang=SGLangSource(archive="elsewhere.tar.gz", ref=FLAGSHIP.sglang.ref))
    assert site.source_key == FLAGSHIP.source_key
    assert site.flag_list_name == FLAGSHIP.flag_list_name


@pytest.fixture(scope="module")
def probe(patched: dict[str, Any]) -> dict[str, Any]:
    pytest.importorskip("torch", reason="torch (CPU) comes with the test extras")
    proc = subprocess.run([sys.executable, str(PROBE), str(patched["tree"] / "python")],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_sources_argument_handling_keeps_block_8_and_budget_32(probe: dict[str, Any]) -> None:
    args = probe["server_args"]
    assert (args["num_draft_tokens"], args["budget"]) == (8, 32)
    assert args["buckets_with_budget"] == [8, 16, 33], "budget+1 is always a captured width"
    assert "exceeds budget + 1" in args["bucket_too_wide_error"]


def test_target_verify_is_captured_at_budget_plus_one_and_the_draft_at_the_block(
        probe: dict[str, Any]) -> None:
    widths = probe["widths"]
    assert widths["DDTREE"] == {"target": 33, "draft": 8}
    for other in ("DFLASH", "EAGLE", "NGRAM"):
        assert widths[other] == {"target": 8, "draft": 8}, other


def test_the_tree_and_its_mask_are_built_for_33_tokens_per_request(probe: dict[str, Any]) -> None:
    tree = probe["tree"]
    assert tree["node_ids_shape"] == [2, 32]
    assert tree["visibility_shape"] == [2, 33, 33] and tree["visibility_dtype"] == "torch.bool"
    assert tree["verify_ids_numel"] == 2 * 33 and tree["positions_numel"] == 2 * 33
    assert tree["root_first"] == [1, 2], "verify input ids start with each request's root token"
    # A boolean, request-packed mask: each request's 33 rows see its past plus the tree.
    assert tree["mask_dtype"] == "torch.bool"
    assert tree["mask_numel"] == 33 * (5 + 33) + 33 * (9 + 33)
    assert tree["buckets"] == [33]
    assert tree["pruned_buckets"][-1] == 33


def _manifest_targets() -> list[tuple[str, str, str]]:
    import yaml

    from appliance.images.plan import PATCHES_DIR

    entries = yaml.safe_load((PATCHES_DIR / "manifest.yaml").read_text())["patches"]
    return [(e["name"], e["file"], source["commit"]) for e in entries for source in e["applies_to"]]


@pytest.mark.parametrize(("name", "file", "commit"), _manifest_targets())
def test_each_kept_patch_applies_to_the_source_it_names_and_compiles(
        name: str, file: str, commit: str, tmp_path: Path) -> None:
    """Patches kept for site recipes of older pins still apply to those commits' snapshots."""
    from appliance.images.plan import PATCHES_DIR

    archive = SNAPSHOTS / f"sglang-{commit}.tar.gz"
    if not archive.is_file():
        pytest.skip(f"no snapshot of {commit[:9]} for {name} in {SNAPSHOTS}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    tree = tmp_path / f"sglang-{commit}"
    (tmp_path / "series").write_text(f"{file}\n")
    proc = subprocess.run([sys.executable, str(APPLIER), "--series", str(tmp_path / "series"),
                           "--patches-dir", str(PATCHES_DIR), "--source-root", str(tree)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    touched = [tree / line.split()[-1].strip("'") for line in proc.stdout.splitlines()
               if line.startswith("patching file")]
    assert touched
    for path in touched:
        py_compile.compile(str(path), doraise=True, cfile=str(path) + ".pyc-test")
