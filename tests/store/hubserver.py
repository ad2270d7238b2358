"""A local Hugging Face hub: the file API as huggingface_hub uses it, for one small repo.

- GET  /api/models/<repo>/revision/<rev>[?blobs=true]  model info: sha, siblings (size, lfs)
- HEAD /<repo>/resolve/<rev>/<path>  ETag, X-Repo-Commit, X-Linked-Size, X-Linked-Etag
- GET  /<repo>/resolve/<rev>/<path>  the bytes, with Range (206 + Content-Range)

Knobs, settable while it runs: `rate` (bytes per second per response, so "mid-file" is a
moment a test can hit), `corrupt` (paths served with one byte flipped while the listing
keeps the true sha256), `drop_after` (close the connection once after that many bytes of a
body: a network fault), `token` (required as a Bearer token when set). Every request is
recorded (method, path, Range, whether the token came) for the tests to read.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

LFS_MIN = 1024  # files at least this big are "LFS" files: their listing carries a sha256


def git_blob_id(data: bytes) -> str:
    """What git (and the hub's listing, blobId) names a file by."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    revisions: tuple[str, ...] = ("main",)

    def sibling(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        item: dict[str, Any] = {"rfilename": path, "size": len(data),
                                "blobId": git_blob_id(data)}
        if len(data) >= LFS_MIN:
            item["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                           "pointerSize": 134}
        return item

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if len(data) >= LFS_MIN else git_blob_id(data)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorized: bool


@dataclass
class HubState:
    repos: dict[str, HubRepo]
    rate: float | None = None
    corrupt: set[str] = field(default_factory=set)
    drop_after: int | None = None
    token: str | None = None
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ranges(self, path: str) -> list[str | None]:
        """The Range header of each GET of a file (None: from its start)."""
        return [r.range for r in self.requests if r.method == "GET" and r.path.endswith(
            "/" + path) and "/resolve/" in r.path]


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+|[^/]+)(/revision/(?P<rev>[^/]+))?$")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:  # quiet: the tests read `requests`
        pass

    def _record(self) -> bool:
        state = self.server.state
        auth = self.headers.get("Authorization", "")
        ok = state.token is None or auth == f"Bearer {state.token}"
        with state.lock:
            state.requests.append(Request(self.command, unquote(urlparse(self.path).path),
                                          self.headers.get("Range"), auth != ""))
        if not ok:
            self._json(401, {"error": "Invalid credentials in Authorization header"})
        return ok

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 404:
            self.send_header("X-Error-Code", body.get("code", "RepoNotFound"))
        self.end_headers()
        self.wfile.write(data)

    def _repo(self, repo_id: str, rev: str) -> HubRepo | None:
        repo = self.server.state.repos.get(repo_id)
        if repo is None:
            self._json(404, {"error": "Repository not found", "code": "RepoNotFound"})
            return None
        if rev not in repo.revisions and rev != repo.commit:
            self._json(404, {"error": "Invalid rev id", "code": "RevisionNotFound"})
            return None
        return repo

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._record():
            return
        path = unquote(urlparse(self.path).path)
        info = _INFO.match(path)
        if info:
            repo = self._repo(info["repo"], info["rev"] or "main")
            if repo:
                self._json(200, {"id": repo.repo_id, "sha": repo.commit, "private": False,
                                 "siblings": [repo.sibling(p) for p in sorted(repo.files)]})
            return
        self._file(path, body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        if self._record():
            self._file(unquote(urlparse(self.path).path), body=False)

    def _file(self, path: str, *, body: bool) -> None:
        found = _RESOLVE.match(path)
        repo = self._repo(found["repo"], found["rev"]) if found else None
        if found is None or repo is None:
            if found is None:
                self._json(404, {"error": "Not found", "code": "EntryNotFound"})
            return
        name = found["path"]
        if name not in repo.files:
            self._json(404, {"error": "Entry not found", "code": "EntryNotFound"})
            return
        data = repo.files[name]
        if name in self.server.state.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, status = 0, 200
        wanted = _RANGE.match(self.headers.get("Range") or "")
        if wanted and body:
            start, status = int(wanted[1]), 206
        self.send_response(status)
        self.send_header("ETag", f'"{repo.etag(name)}"')
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("X-Linked-Etag", f'"{repo.etag(name)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self._send(data[start:])

    def _send(self, data: bytes) -> None:
        state, sent, chunk = self.server.state, 0, 4096
        began = time.monotonic()
        while sent < len(data):
            if state.drop_after is not None and sent >= state.drop_after:
                state.drop_after = None  # once
                self.close_connection = True
                return
            piece = data[sent:sent + chunk]
            try:
                self.wfile.write(piece)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return
            sent += len(piece)
            if state.rate:
                ahead = sent / state.rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: HubState


class HubServer:
    """The server on 127.0.0.1 (a free port), in a thread; `url` is its HF_ENDPOINT."""

    def __init__(self, *repos: HubRepo) -> None:
        self.state = HubState(repos={r.repo_id: r for r in repos})
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def small_repo(repo_id: str = "acme/tiny-llama", shard_bytes: int = 256 * 1024) -> HubRepo:
    """A checkpoint a test can wait for: config, index, two real safetensors shards."""
    from tests.models import safetensors_bytes

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 128,
              "torch_dtype": "bfloat16"}
    values = shard_bytes // 4
    shards = {f"model-0000{i}-of-00002.safetensors": safetensors_bytes(values + i)
              for i in (1, 2)}
    index = {"metadata": {"total_size": sum(len(b) for b in shards.values())},
             "weight_map": {f"w{i}": name for i, name in enumerate(shards)}}
    files = {"config.json": json.dumps(config).encode(),
             "model.safetensors.index.json": json.dumps(index).encode(), **shards}
    return HubRepo(repo_id=repo_id, files=files)
