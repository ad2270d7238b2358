"""What is in a model root: each model folder, what it is and whether it is whole.

A model folder is one that holds config.json, found up to MAX_DEPTH below the root
(<name>, <org>/<name>, or the Hugging Face cache's models--<org>--<name>/snapshots/<commit>).
Repo id and revision come from the store's marker file (written by a download, MARKER) or
from the cache layout; a folder copied by hand has neither.

Whole means: no file still being downloaded (*.incomplete), every file the marker lists at
its size, every shard model.safetensors.index.json names present, and every safetensors
file as long as its own header says (a copy cut short is caught without reading it all).
Checksums are the download's business (appliance.store.hub): a scan never hashes.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.store.config import CONFIG_NAME, config_summary, is_drafter, read_config_file

MARKER = ".appliance-model.json"
PARTIAL_SUFFIX = ".incomplete"
MAX_DEPTH = 4  # root/hub/models--org--name/snapshots/<commit>
MAX_FOLDERS = 1000  # a root is a models folder, not a file system to crawl
_HEADER_MAX = 100 * 1024 * 1024  # safetensors' own cap on the header
_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class ScannedModel:
    relative_path: str
    repo_id: str
    revision: str
    commit: str
    size_bytes: int
    file_count: int
    kind: str  # "target" or "drafter"
    config: dict[str, Any]
    problems: tuple[str, ...] = ()
    marker: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def whole(self) -> bool:
        return not self.problems


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(folder: Path, data: dict[str, Any]) -> None:
    """Atomically, so a scan never reads half a marker."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, folder / MARKER)


def _model_folders(root: Path) -> Iterator[Path]:
    """Folders holding config.json, breadth-first, never below one (its subfolders are its
    own), hidden folders skipped."""
    level, seen = [root], 0
    for _ in range(MAX_DEPTH + 1):
        below: list[Path] = []
        for folder in level:
            if folder != root and (folder / CONFIG_NAME).is_file():
                yield folder
                continue
            try:
                below += sorted(p for p in folder.iterdir()
                                if p.is_dir() and not p.name.startswith("."))
            except OSError:
                continue  # unreadable folder: nothing to list there
            seen += 1
            if seen > MAX_FOLDERS:
                return
        level = below


def _files(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name != MARKER and not name.endswith(".tmp"):
                yield Path(dirpath, name)


def safetensors_problem(path: Path, size: int) -> str | None:
    """None when the file is as long as its header says (8-byte length, JSON header, data)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                return f"{path.name} is {size} bytes: too short for a safetensors file"
            length = struct.unpack("<Q", raw)[0]
            if length > _HEADER_MAX or 8 + length > size:
                return f"{path.name}: its header length {length} is past the end of the file"
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        return f"{path.name} cannot be read as safetensors ({type(exc).__name__})"
    ends = [t["data_offsets"][1] for k, t in header.items()
            if k != "__metadata__" and isinstance(t, dict) and "data_offsets" in t]
    want = 8 + length + max(ends, default=0)
    if want != size:
        return f"{path.name} is {size} bytes but its header says {want}: cut short or padded"
    return None


def _index_problems(folder: Path, present: set[str]) -> list[str]:
    try:
        index = json.loads((folder / _INDEX).read_text())
    except (OSError, ValueError):
        return []
    shards = set((index.get("weight_map") or {}).values())
    return [f"{name} is named in {_INDEX} but missing" for name in sorted(shards - present)]


def _marker_problems(marker: dict[str, Any] | None, sizes: dict[str, int]) -> list[str]:
    if marker is None:
        return []
    found = []
    for item in marker.get("files") or []:
        path, size = item.get("path"), item.get("size")
        if path not in sizes:
            found.append(f"{path} is missing")
        elif isinstance(size, int) and sizes[path] != size:
            found.append(f"{path} is {sizes[path]} bytes, the hub's is {size}")
    return found


def folder_problems(folder: Path, sizes: dict[str, int],
                    marker: dict[str, Any] | None) -> list[str]:
    found = [f"{p} is still being downloaded" for p in sorted(sizes)
             if p.endswith(PARTIAL_SUFFIX)]
    complete = {p: s for p, s in sizes.items() if not p.endswith(PARTIAL_SUFFIX)}
    found += _marker_problems(marker, complete)
    found += _index_problems(folder, set(complete))
    weights = [p for p in complete if p.endswith((".safetensors", ".bin"))]
    if not weights:
        found.append("no weight files (*.safetensors or *.bin)")
    for rel in weights:
        if rel.endswith(".safetensors"):
            problem = safetensors_problem(folder / rel, complete[rel])
            if problem:
                found.append(problem)
    return found


def _cache_identity(root: Path, folder: Path) -> tuple[str, str, str]:
    """repo id, revision, commit from the HF cache layout (empty when not in one)."""
    parts = folder.relative_to(root).parts
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return "", "", ""
    repo = parts[-3].removeprefix("models--").replace("--", "/")
    commit = parts[-1]
    refs = folder.parent.parent / "refs"
    try:
        names = [r.name for r in refs.iterdir() if r.read_text().strip() == commit]
    except OSError:
        names = []
    return repo, (names[0] if names else commit), commit


def scan_folder(root: Path, folder: Path) -> ScannedModel:
    sizes: dict[str, int] = {}
    for path in _files(folder):
        try:
            sizes[str(path.relative_to(folder))] = path.stat().st_size
        except OSError:
            continue  # a dangling link (a cache blob removed): the marker or index names it
    marker = read_marker(folder)
    repo, revision, commit = _cache_identity(root, folder)
    if marker:
        repo = str(marker.get("repo_id") or repo)
        revision = str(marker.get("revision") or revision)
        commit = str(marker.get("commit") or commit)
    config = read_config_file(folder) or {}
    complete = {p: s for p, s in sizes.items() if not p.endswith(PARTIAL_SUFFIX)}
    return ScannedModel(
        relative_path=str(folder.relative_to(root)), repo_id=repo, revision=revision,
        commit=commit, size_bytes=sum(complete.values()), file_count=len(complete),
        kind="drafter" if is_drafter(config) else "target", config=config_summary(config),
        problems=tuple(folder_problems(folder, sizes, marker)), marker=marker)


def scan_root(root: str | Path) -> list[ScannedModel]:
    """Every model folder in one root; an absent root has none."""
    top = Path(root)
    if not top.is_dir():
        return []
    return [scan_folder(top, folder) for folder in _model_folders(top)]
