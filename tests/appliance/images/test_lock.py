"""Recipe locks from pip's real installation reports (`pip install --report`), installed back
with --require-hashes; and the shipped flagship lock against its source's own pins."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from appliance.engine.recipes import load_recipe
from appliance.images.lock import LockError, lock_text, reports_from_tar

PIP = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}


def pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PIP, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          check=False, timeout=120)


def wheel(tmp: Path, name: str, version: str, body: str = "") -> Path:
    src = tmp / f"src-{name}-{version}"
    (src / name.replace("-", "_")).mkdir(parents=True, exist_ok=True)
    (src / name.replace("-", "_") / "__init__.py").write_text(body)
    (src / "setup.py").write_text(f"from setuptools import setup\nsetup(name={name!r}, "
                                  f"version={version!r}, packages=[{name.replace('-', '_')!r}])\n")
    done = pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "wheels"),
               str(src), cwd=tmp)
    assert done.returncode == 0, done.stderr
    return next((tmp / "wheels").glob(f"{name.replace('-', '_')}-{version}-*.whl"))


def report(tmp: Path, *reqs: str) -> dict:
    out = tmp / "report.json"
    done = pip("install", "-q", "--dry-run", "--ignore-installed", "--no-index", "--find-links",
               str(tmp / "wheels"), "--report", str(out), *reqs, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_a_lock_pins_what_pip_installed_by_version_and_hash(tmp_path: Path) -> None:
    built = wheel(tmp_path, "tiny-a", "1.2.3")
    wheel(tmp_path, "tiny-b", "0.1")
    text = lock_text([report(tmp_path, "tiny-a", "tiny-b")], header="test lock")
    digest = hashlib.sha256(built.read_bytes()).hexdigest()
    assert text.startswith("# test lock\n")
    assert f"tiny-a==1.2.3 \\\n    --hash=sha256:{digest}\n" in text
    assert re.search(r"^tiny-b==0\.1 \\$", text, re.M)


def test_pip_installs_from_the_lock_and_refuses_a_changed_package(tmp_path: Path) -> None:
    wheel(tmp_path, "tiny-a", "1.2.3")
    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text([report(tmp_path, "tiny-a")]))
    args = ["install", "--dry-run", "--ignore-installed", "--no-index", "--find-links",
            str(tmp_path / "wheels"), "--require-hashes", "--no-deps", "-r", str(lock)]
    assert pip(*args, cwd=tmp_path).returncode == 0
    # The same name and version with other content (a re-published or tampered wheel).
    (tmp_path / "wheels").joinpath(next((tmp_path / "wheels").iterdir()).name).unlink()
    wheel(tmp_path, "tiny-a", "1.2.3", body="changed = True\n")
    refused = pip(*args, cwd=tmp_path)
    assert refused.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr


def test_the_local_source_tree_is_not_locked_and_a_split_set_is_an_error(tmp_path: Path) -> None:
    wheel(tmp_path, "tiny-a", "1.0")
    local = {"download_info": {"url": "file:///opt/sglang/python", "dir_info": {"editable": True}},
             "metadata": {"name": "sglang", "version": "0.0.0"}}
    first = report(tmp_path, "tiny-a")
    assert "sglang" not in lock_text([first | {"install": [*first["install"], local]}])
    wheel(tmp_path, "tiny-a", "2.0")
    second = report(tmp_path, "tiny-a==2.0")
    with pytest.raises(LockError, match="tiny-a was installed as 1.0 and 2.0"):
        lock_text([first, second])
    with pytest.raises(LockError, match="nothing to lock"):
        lock_text([{"install": [local]}])


def test_reports_are_read_from_the_images_lock_folder() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("lock/pip-report-sglang.json", b'{"install": []}'),
                           ("lock/requirements.txt", b""), ("lock/other.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert reports_from_tar(buf.getvalue()) == [{"install": []}]


def test_the_flagship_lock_pins_every_package_and_agrees_with_its_sources_pins() -> None:
    recipe = load_recipe("kimi-k2.6-ddtree")
    assert recipe.lock_path is not None and recipe.lock_path.is_file()
    text = recipe.lock_path.read_text()
    entries = re.findall(r"^([a-z0-9.-]+)==(\S+) \\\n    --hash=sha256:[0-9a-f]{64}", text, re.M)
    pins = dict(entries)
    assert len(entries) == len(pins) > 150
    assert len(entries) == len(re.findall(r"^\S", text.split("\n", 2)[2], re.M)), \
        "every requirement line is pinned with a hash"
    # The source's own pyproject.toml pins (433c58ed7): torch 2.11.0, sglang-kernel 0.4.5,
    # flashinfer_python 0.6.14, transformers 5.12.1; torchvision is unpinned there.
    assert (pins["torch"], pins["sglang-kernel"], pins["flashinfer-python"],
            pins["transformers"]) == ("2.11.0", "0.4.5", "0.6.14", "5.12.1")
    assert "torchvision" in pins and "sglang" not in pins


def test_each_version_gets_every_file_hash_the_index_lists(tmp_path: Path) -> None:
    """A PEP 691 index on loopback lists two wheels of tiny-a 1.2.3 (this Python's and
    another's) and one of another version: the lock carries the first two hashes."""
    import http.server
    import threading

    built = wheel(tmp_path, "tiny-a", "1.2.3")
    ours = hashlib.sha256(built.read_bytes()).hexdigest()
    other, old = "a" * 64, "b" * 64
    page = {"meta": {"api-version": "1.1"}, "name": "tiny-a", "files": [
        {"filename": built.name, "hashes": {"sha256": ours}},
        {"filename": "tiny_a-1.2.3-cp312-cp312-manylinux_2_28_x86_64.whl",
         "hashes": {"sha256": other}},
        {"filename": "tiny_a-1.2.2.tar.gz", "hashes": {"sha256": old}}]}
    seen: list[str] = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(f"{self.path} {self.headers['Accept']}")
            body = json.dumps(page).encode() if self.path == "/simple/tiny-a/" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        text = lock_text([report(tmp_path, "tiny-a")], index_url=url)
    finally:
        server.shutdown()
    assert seen == ["/simple/tiny-a/ application/vnd.pypi.simple.v1+json"]
    assert f"--hash=sha256:{ours}" in text and f"--hash=sha256:{other}" in text
    assert old not in text
    with pytest.raises(LockError, match=r"tiny-a==1\.2\.3: the index .* did not answer"):
        lock_text([report(tmp_path, "tiny-a")], index_url=url)
