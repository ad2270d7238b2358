"""The panel image's build behind a TLS-intercepting proxy it does not trust: pip's
CERTIFICATE_VERIFY_FAILED comes with the line that names the fix (docker/panel/ca/ca.pem).

The build is docker/panel/Dockerfile as shipped, with one line added after the first FROM
that points pip at a local HTTPS index whose certificate nobody trusts (a proxy's, as the
build sees it)."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import docker
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON_IMAGE = "appliance-python:bookworm"
pytestmark = pytest.mark.docker


@pytest.fixture
def untrusted_index(tmp_path: Path) -> Iterator[str]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()),
                                             http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()


def _context(tmp_path: Path, index: str) -> Path:
    context = tmp_path / "context"
    for part in ("appliance", "web", "worker", "docker/panel"):
        shutil.copytree(ROOT / part, context / part,
                        ignore=shutil.ignore_patterns("__pycache__", "ca.pem"))
    for name in ("pyproject.toml", "README.md", "manage.py"):
        shutil.copy(ROOT / name, context / name)
    dockerfile = context / "docker" / "panel" / "Dockerfile"
    text = dockerfile.read_text()
    first_from = text.index("FROM ${PYTHON_IMAGE} AS wheels\n") + len("FROM ${PYTHON_IMAGE} AS wheels\n")
    dockerfile.write_text(text[:first_from] + f"ENV PIP_INDEX_URL={index} NO_PROXY=127.0.0.1 "
                          "no_proxy=127.0.0.1 PIP_RETRIES=0\n" + text[first_from:])
    return context


def test_a_certificate_error_in_the_build_names_the_ca_file(tmp_path: Path,
                                                            untrusted_index: str) -> None:
    if not docker.from_env().images.list(name=PYTHON_IMAGE):
        pytest.skip(f"{PYTHON_IMAGE} missing: run bash docker/base/make-base-image.sh")
    context = _context(tmp_path, untrusted_index)
    done = subprocess.run(
        ["docker", "build", "--network", "host", "--target", "wheels", "--no-cache",
         "--build-arg", f"PYTHON_IMAGE={PYTHON_IMAGE}", "-f", "docker/panel/Dockerfile",
         "-t", "appliance-panel-build-test:wheels", "."],
        cwd=context, capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in out
    assert ("appliance: behind a TLS-intercepting proxy? copy its CA bundle to "
            "docker/panel/ca/ca.pem and build again") in out
