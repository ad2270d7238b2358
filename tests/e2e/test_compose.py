"""compose.yaml is read by docker-compose (v1.29 here; v2 reads the same file)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_accepts_the_file_and_keeps_the_engine_network_and_socket() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", "compose.yaml", "config"],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "APPLIANCE_PYTHON_IMAGE": "local/python:3"},
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert set(config["services"]) == {"web", "worker", "redis", "postgres"}
    assert config["networks"]["default"]["name"] == "appliance"
    worker = config["services"]["worker"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in str(worker["volumes"])
    assert worker["environment"]["APPLIANCE_ENGINE_NETWORK"] == "appliance"
    web = config["services"]["web"]
    assert web["build"]["args"]["PYTHON_IMAGE"] == "local/python:3"
    published = web["ports"][0]
    assert "127.0.0.1" in str(published) and "8000" in str(published)
