"""Where an engine image's SGLang source comes from when it is on this machine: a local git
repository or a source archive. Either is packed into the build context as src/sglang.tar
(the tree at the pinned commit, without a top folder), so the build needs no network for it.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any


class SourceError(RuntimeError):
    pass


def local_git_dir(url: str | None) -> Path | None:
    """A git source on this machine is archived into the build context (no network)."""
    if not url:
        return None
    path = Path(url.removeprefix("file://"))
    return path if path.is_absolute() and path.exists() else None


def _git(repo: Path, *args: str) -> bytes:
    # safe.directory: a source mounted into the worker belongs to another user there.
    proc = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), *args],
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise SourceError(f"git {' '.join(args)} in {repo}: {proc.stderr.decode().strip()}")
    return proc.stdout


def git_source_files(repo: Path, ref: str | None) -> dict[str, bytes]:
    commit = _git(repo, "rev-parse", "--verify", f"{ref or 'HEAD'}^{{commit}}").decode().strip()
    return {"src/sglang.tar": _git(repo, "archive", "--format=tar", commit),
            "src/sglang.ref": f"{repo}@{commit}\n".encode()}


def archive_source_files(archive: Path, ref: str) -> dict[str, bytes]:
    """A snapshot archive (sglang-<commit>.tar.gz with one top folder sglang-<commit>/)
    re-packed without its top folder, members in name order with fixed owners and times,
    so the same archive always gives the same bytes (and the same image tag)."""
    if not archive.is_file():
        raise SourceError(f"the source archive {archive} does not exist")
    top = f"sglang-{ref}/"
    out = io.BytesIO()
    with tarfile.open(archive, "r:*") as src, tarfile.open(fileobj=out, mode="w") as dst:
        members = sorted(src.getmembers(), key=lambda m: m.name)
        if not members or not all(m.name.rstrip("/") + "/" == top or m.name.startswith(top)
                                  for m in members):
            raise SourceError(f"{archive.name} does not hold {top} (the commit the recipe pins "
                              f"as ref); use the archive of that commit")
        for member in members:
            _copy_member(src, dst, member, member.name[len(top):])
    return {"src/sglang.tar": out.getvalue(), "src/sglang.ref": f"{archive.name}@{ref}\n".encode()}


def _copy_member(src: tarfile.TarFile, dst: tarfile.TarFile, member: tarfile.TarInfo,
                 name: str) -> None:
    if not name or not (member.isfile() or member.isdir() or member.issym()):
        return
    if name.startswith("/") or ".." in Path(name).parts:
        raise SourceError(f"the source archive has an unsafe member name {member.name!r}")
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = member.type, member.mode, member.linkname
    info.mtime, info.uid, info.gid = 0, 0, 0
    data: Any = None
    if member.isfile():
        info.size = member.size
        data = src.extractfile(member)
    dst.addfile(info, data)
