"""Engine image plans: a recipe becomes a build context and a content-addressed tag.

The tag is a hash of everything that goes into the image (the recipe, its patch files,
the Dockerfile template, the helper scripts and the GPU self-check), so an existing tag
means an identical image and the build is skipped.

The GPU self-check (appliance.selfcheck) travels into the image as a zip application,
/opt/appliance/selfcheck.pyz, which the entrypoint runs with the image's own Python
before the engine: the package needs only the standard library at import time.

CA bundle (TLS-intercepting proxies): the daemon here is the legacy builder, which has
no build secrets and no `RUN --mount`. We pass the PEM as the build arg
APPLIANCE_CA_PEM_0..3 (a build arg becomes one environment string of the RUN command,
and Linux refuses a single one over 128 KiB, while a distribution's whole bundle is about
200 KiB); `with-ca.sh` joins them into a temporary file for the download commands
only and deletes it in the same RUN, so no layer's filesystem holds it. The honest
caveat: the legacy builder records build-arg values in the image history (`docker
history --no-trunc`). A CA certificate is public (its key never leaves the proxy), so we
accept that rather than a multi-stage copy that would double the multi-GB layers. The
bundle is not part of the tag: it changes how files are fetched, not what is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import tarfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from appliance.images import sources
from appliance.images.lock import LOCK_LABEL, lock_digest

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_DIR.parent
ENGINE_DIR = REPO_ROOT / "docker" / "engine"
PATCHES_DIR = Path(__file__).resolve().parent / "patches"
SELFCHECK_PACKAGE = PACKAGE_DIR / "selfcheck"
SELFCHECK_IN_CONTEXT = "runtime/selfcheck.pyz"
DEFAULT_BASE_IMAGE = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
CA_ARG_PREFIX = "APPLIANCE_CA_PEM_"
CA_ARG_COUNT = 4  # as many ARG lines as docker/engine/Dockerfile declares
CA_CHUNK_BYTES = 96 * 1024  # under Linux's 128 KiB limit for one environment string
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same source gives the same tag


class SGLangSourceLike(Protocol):
    pip: str | None
    git: str | None
    ref: str | None


class RecipeLike(Protocol):
    """What a build needs from appliance.engine.recipes.Recipe (structural, so tests and the
    recipe loader stay decoupled)."""

    name: str
    base_image: str
    sglang: Any  # SGLangSourceLike
    patches: list[str]
    pip_extras: list[str]
    env: dict[str, str]
    build_args: dict[str, str]
    path: Path | None


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    tag: str
    files: dict[str, bytes]  # build context: archive path -> content
    buildargs: dict[str, str]
    labels: dict[str, str]


class BuildError(RuntimeError):
    pass


def engine_repo() -> str:
    return os.environ.get("APPLIANCE_ENGINE_REPO", "appliance-engine")


IMAGE_FIELDS = ("name", "base_image", "patches", "pip_extras", "env", "build_args")
SOURCE_FIELDS = ("pip", "git", "ref")  # an archive stands for its git commit: same tag inputs


def _recipe_dict(recipe: RecipeLike) -> dict[str, Any]:
    """The recipe fields that change the image; where the file lives, its description
    and engine defaults do not."""
    data = {key: getattr(recipe, key) for key in IMAGE_FIELDS}
    data["sglang"] = {key: getattr(recipe.sglang, key, None) for key in SOURCE_FIELDS}
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _manifest_files(patches_dir: Path) -> dict[str, str]:
    manifest = patches_dir / "manifest.yaml"
    if not manifest.exists():
        return {}
    entries = (yaml.safe_load(manifest.read_text()) or {}).get("patches", [])
    return {e["name"]: e["file"] for e in entries}


def resolve_patch(entry: str, recipe: RecipeLike, patches_dir: Path = PATCHES_DIR) -> Path:
    """A recipe names a patch from the manifest, or gives a path (absolute or relative
    to the recipe file)."""
    by_name = _manifest_files(patches_dir)
    if entry in by_name:
        return patches_dir / by_name[entry]
    candidates = [Path(entry)]
    if recipe.path is not None:
        candidates.insert(0, Path(recipe.path).parent / entry)
    candidates.append(patches_dir / entry)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(by_name)) or "none"
    raise BuildError(f"patch {entry!r} is neither in the manifest ({known}) nor a file")


def _render_dockerfile(recipe: RecipeLike, extra_steps: Sequence[str]) -> bytes:
    text = (ENGINE_DIR / "Dockerfile").read_text()
    env_lines = [f"ENV {k}={json.dumps(v)}" for k, v in sorted(recipe.env.items())]
    text = text.replace("# @RECIPE_ENV@", "\n".join(env_lines))
    text = text.replace("# @EXTRA_STEPS@", "\n".join(extra_steps))
    return text.encode()


def _tree_files(directory: Path, prefix: str) -> dict[str, bytes]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {f"{prefix}/{p.relative_to(directory).as_posix()}": p.read_bytes() for p in files}


def _context_files(
    recipe: RecipeLike, patches: list[Path], extra_steps: Sequence[str], gpucheck: Path | None
) -> dict[str, bytes]:
    files = {"Dockerfile": _render_dockerfile(recipe, extra_steps), "src/.keep": b""}
    files |= _tree_files(ENGINE_DIR / "tools", "tools")
    files |= _tree_files(ENGINE_DIR / "runtime", "runtime")
    if gpucheck is not None and gpucheck.is_dir():
        files[SELFCHECK_IN_CONTEXT] = selfcheck_zipapp(gpucheck)
    elif gpucheck is not None and gpucheck.is_file():
        files[SELFCHECK_IN_CONTEXT] = gpucheck.read_bytes()  # a single-file check program
    files["patches/series"] = "".join(f"{p.name}\n" for p in patches).encode()
    files |= {f"patches/{p.name}": p.read_bytes() for p in patches}
    if (PATCHES_DIR / "manifest.yaml").exists():
        files["patches/manifest.yaml"] = (PATCHES_DIR / "manifest.yaml").read_bytes()
    files |= _source_files(recipe)
    lock = recipe_lock_path(recipe)
    files["lock/requirements.txt"] = lock.read_bytes() if lock is not None else b""
    return files


def recipe_lock_path(recipe: RecipeLike) -> Path | None:
    path: Path | None = getattr(recipe, "lock_path", None)
    if path is not None and not path.is_file():
        raise BuildError(f"the recipe's lock {path} does not exist; make it with "
                         f"`appliance lock {recipe.name} --image <a resolved build>`")
    return path


def _source_files(recipe: RecipeLike) -> dict[str, bytes]:
    """The SGLang tree for the build context when it is on this machine (a local git
    repository or a source archive); a remote git source or a release is fetched in the build."""
    src = recipe.sglang
    try:
        archive = getattr(src, "archive", None)
        if archive:
            resolve = getattr(recipe, "resolve_path", Path)
            path = resolve(archive)
            return sources.archive_source_files(path, src.ref or "")
        local = sources.local_git_dir(src.git)
        return sources.git_source_files(local, src.ref) if local is not None else {}
    except sources.SourceError as exc:
        raise BuildError(str(exc)) from exc


def selfcheck_zipapp(package: Path) -> bytes:
    """The self-check package as a zip application (`python3 selfcheck.pyz ARGS`).

    The zip holds `appliance/__init__.py`, the package's modules and a `__main__.py`
    that runs it; entries are sorted and dated ZIP_EPOCH, so the bytes (and the tag)
    change only when the source does.
    """
    entries = {"__main__.py": b"import runpy\n\nrunpy.run_module('appliance.selfcheck', "
                              b"run_name='__main__', alter_sys=True)\n",
               "appliance/__init__.py": b""}
    for path in sorted(package.glob("*.py")):
        entries[f"appliance/{package.name}/{path.name}"] = path.read_bytes()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(entries):
            zf.writestr(zipfile.ZipInfo(name, ZIP_EPOCH), entries[name])
    return buf.getvalue()


def _buildargs(recipe: RecipeLike, local_source: bool) -> dict[str, str]:
    src = recipe.sglang
    base_version = getattr(src, "base_version", None) or "0.0.0"
    args = {
        "BASE_IMAGE": recipe.base_image or DEFAULT_BASE_IMAGE,
        "SGLANG_PIP": src.pip or "",
        "SGLANG_GIT": "" if local_source else (src.git or ""),
        "SGLANG_REF": src.ref or "",
        "PIP_EXTRAS": " ".join(recipe.pip_extras),
    }
    if src.ref and not src.pip:
        # A source tree without .git: setuptools-scm cannot read a version, so give it one.
        args["SGLANG_SCM_VERSION"] = f"{base_version}+g{src.ref[:9]}"
    return args | dict(recipe.build_args)


def _content_tag(recipe: RecipeLike, files: Mapping[str, bytes], args: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(_recipe_dict(recipe), sort_keys=True).encode())
    digest.update(json.dumps(dict(args), sort_keys=True).encode())
    for name in sorted(files):
        digest.update(f"\0{name}\0{len(files[name])}\0".encode())
        digest.update(files[name])
    slug = re.sub(r"[^a-z0-9_.-]+", "-", recipe.name.lower()).strip("-.") or "recipe"
    return f"{engine_repo()}:{slug[:100]}-{digest.hexdigest()[:12]}"


def plan_build(
    recipe: RecipeLike,
    *,
    ca_bundle: Path | None = None,
    patches_dir: Path = PATCHES_DIR,
    gpucheck: Path | None = SELFCHECK_PACKAGE,
    extra_steps: Sequence[str] = (),
    base_id: str | None = None,
) -> BuildPlan:
    """Everything a build sends to the daemon, and the tag it will carry.

    extra_steps are Dockerfile lines placed after the SGLang install (site hooks; the
    tests use one to make a slow step to cancel). They are part of the tag.
    base_id is the base image's id (sha256:...) where the daemon has it: a base image
    re-pulled under the same name with other content then gives another tag.
    """
    patches = [resolve_patch(entry, recipe, patches_dir) for entry in recipe.patches]
    files = _context_files(recipe, patches, extra_steps, gpucheck)
    args = _buildargs(recipe, "src/sglang.tar" in files)
    tag = _content_tag(recipe, files, args | ({"BASE_IMAGE_ID": base_id} if base_id else {}))
    if ca_bundle is not None:
        args |= ca_buildargs(Path(ca_bundle).read_text())
    labels = {"appliance.recipe": recipe.name, "appliance.content-tag": tag}
    if files.get("lock/requirements.txt"):
        # A fleet host checks it against the panel's lock before it runs the image.
        labels[LOCK_LABEL] = lock_digest(files["lock/requirements.txt"])
    if base_id:
        labels["appliance.base-image-id"] = base_id
    return BuildPlan(tag=tag, files=files, buildargs=args, labels=labels)


def ca_buildargs(pem: str) -> dict[str, str]:
    """A CA bundle as the build args with-ca.sh joins back together, in order."""
    chunks = [pem[i:i + CA_CHUNK_BYTES] for i in range(0, len(pem), CA_CHUNK_BYTES)]
    if len(chunks) > CA_ARG_COUNT:
        limit = CA_ARG_COUNT * CA_CHUNK_BYTES // 1024
        raise BuildError(f"the CA bundle is {len(pem) // 1024} KiB; at most {limit} KiB fits "
                         "in the build: pass only the proxy's CA certificate")
    return {f"{CA_ARG_PREFIX}{i}": chunk for i, chunk in enumerate(chunks)}


def context_tar(files: Mapping[str, bytes]) -> io.BytesIO:
    """An in-memory, reproducible tar of the build context (fixed mtimes and owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o755 if name.endswith((".sh", ".py")) else 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    buf.seek(0)
    return buf
