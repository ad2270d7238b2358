"""Recipe locks: the exact packages of a resolved engine build, with their hashes.

A build without a lock lets pip resolve and keeps pip's installation reports
(`pip install --report`, /opt/appliance/lock/pip-report-*.json in the image). This module
turns those reports into a requirements file (`name==version --hash=sha256:...` per
package) that later builds install with `pip install --require-hashes --no-deps`, so the
same recipe gives the same packages on every rebuild and a changed package cannot hide.

A report holds the hash of the one file pip chose, which is specific to that build's Python
and platform (a cp311 wheel on a Debian base, a cp312 one on Ubuntu 24.04). So each pinned
version also gets the hashes of all its files from the package index's JSON simple API
(PEP 691), and the lock installs on any base that resolves to the same versions.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

REPORT_DIR = "/opt/appliance/lock"
# The image label holding its recipe lock's digest (appliance.images.plan sets it): a fleet
# host refuses an image whose label differs from the lock the panel sends (docs/fleet.md).
LOCK_LABEL = "appliance.recipe-lock"


def lock_digest(text: bytes) -> str:
    """The digest a lock is known by across the fleet: sha256 of its requirements file."""
    return "sha256:" + hashlib.sha256(text).hexdigest()


class LockError(RuntimeError):
    pass


def _entry(item: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(normalised name, version, sha256) of one installed item; None for the local tree
    itself (a directory has no hash: it is pinned by the recipe's commit instead)."""
    info = item.get("download_info") or {}
    meta = item.get("metadata") or {}
    archive = info.get("archive_info")
    if archive is None:
        return None
    hashes = archive.get("hashes") or {}
    digest = hashes.get("sha256")
    if digest is None and str(archive.get("hash", "")).startswith("sha256="):
        digest = archive["hash"].split("=", 1)[1]
    name, version = meta.get("name"), meta.get("version")
    if not (name and version and digest):
        raise LockError(f"pip's report has no name, version or sha256 for {info.get('url')}")
    return name.lower().replace("_", "-"), str(version), str(digest)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _file_version(filename: str) -> tuple[str, str] | None:
    """(project, version) of a wheel (name-version-tags.whl) or sdist (name-version.tar.gz)."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (_normal(parts[0]), parts[1]) if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip"):
        if filename.endswith(ext):
            name, _, version = filename[: -len(ext)].rpartition("-")
            return (_normal(name), version) if name else None
    return None


Fetch = Callable[[str], bytes]


def _http_get(url: str) -> bytes:
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    request = urllib.request.Request(url, headers=accept)
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (index URL)
        return bytes(response.read())


def index_hashes(name: str, version: str, index_url: str, fetch: Fetch = _http_get) -> list[str]:
    """sha256 of every file of name==version on a PEP 691 index (JSON simple API)."""
    page = json.loads(fetch(f"{index_url.rstrip('/')}/{_normal(name)}/"))
    found = []
    for item in page.get("files", []):
        parsed = _file_version(str(item.get("filename", "")))
        digest = (item.get("hashes") or {}).get("sha256")
        if parsed == (_normal(name), version) and digest:
            found.append(str(digest))
    return sorted(set(found))


def lock_text(reports: Iterable[Mapping[str, Any]], header: str = "",
              index_url: str | None = None, fetch: Fetch = _http_get) -> str:
    """The lock for every package the reports installed, sorted by name. The same package
    twice with different versions or hashes is an error: the build would not be one set.
    With index_url, each version also carries the hashes of all its files on that index."""
    chosen: dict[str, tuple[str, str]] = {}
    for report in reports:
        for item in report.get("install", []):
            entry = _entry(item)
            if entry is None:
                continue
            name, version, digest = entry
            if name in chosen and chosen[name] != (version, digest):
                raise LockError(f"{name} was installed as {chosen[name][0]} and {version}")
            chosen[name] = (version, digest)
    if not chosen:
        raise LockError("the reports installed no package from an index: nothing to lock")
    lines = [f"# {line}" for line in header.splitlines()]
    for name, (version, digest) in sorted(chosen.items()):
        digests = {digest}
        if index_url:
            try:
                digests.update(index_hashes(name, version, index_url, fetch))
            except (OSError, ValueError) as exc:
                raise LockError(f"{name}=={version}: the index {index_url} did not answer "
                                f"({exc})") from exc
        hashes = " \\\n".join(f"    --hash=sha256:{d}" for d in sorted(digests))
        lines.append(f"{name}=={version} \\\n{hashes}")
    return "\n".join(lines) + "\n"


def reports_from_tar(data: bytes) -> list[dict[str, Any]]:
    """pip reports out of a tar stream of REPORT_DIR (docker's get_archive)."""
    reports: list[dict[str, Any]] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base.startswith("pip-report") and base.endswith(".json"):
                handle = tar.extractfile(member)
                if handle is not None:
                    reports.append(json.loads(handle.read()))
    return reports


def reports_from_image(client: Any, image: str) -> list[dict[str, Any]]:
    """The pip reports a resolved build left in its image (read from a created, never
    started container)."""
    container = client.containers.create(image, entrypoint=["true"])
    try:
        stream, _ = container.get_archive(REPORT_DIR)
        reports = reports_from_tar(b"".join(stream))
    finally:
        container.remove(force=True)
    if not reports:
        raise LockError(f"{image} has no pip reports in {REPORT_DIR}: it was built from a lock "
                        "or before locks existed; build the recipe without its lock first")
    return reports
