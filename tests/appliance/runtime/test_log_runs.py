"""The log stream read in runs (appliance.runtime.logstream.log_frames(runs=True), what the
follower reads): the same lines as frame by frame, through a real Docker engine, for output
that crosses every run boundary there is: stdout and stderr interleaved, a line Docker cuts
into stamped pieces (over 16 KiB), UTF-8 across a cut, a last line without its newline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import docker.errors
import pytest
from docker.client import DockerClient
from docker.models.containers import Container

from appliance.runtime.logstream import lines_of, log_frames
from tests.conftest_docker import BASE_IMAGE, TEST_LABELS, docker_client  # noqa: F401

pytestmark = pytest.mark.docker

SCRIPT = r"""
import sys
out, err = sys.stdout, sys.stderr
for i in range(3000):
    (err if i % 7 == 0 else out).write(f"line {i} ünï ✓\n")
    if i % 500 == 0:
        out.write("x" * 40_000 + "é" * 9_000 + "\n")  # cut by Docker into stamped pieces
    if i % 97 == 0:
        out.flush(); err.flush()
out.write("the last, unended")
"""


@pytest.fixture
def finished(docker_client: DockerClient) -> Iterator[Container]:  # noqa: F811
    container = docker_client.containers.run(BASE_IMAGE, ["python3", "-c", SCRIPT],
                                             detach=True, labels=dict(TEST_LABELS))
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0
        yield container
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


@pytest.mark.parametrize("timestamps", [True, False])
def test_runs_give_the_same_lines_as_frames(finished: Container,
                                            docker_client: DockerClient,  # noqa: F811
                                            timestamps: bool) -> None:
    api = docker_client.api

    def read(runs: bool) -> list[tuple[str, str, int | None]]:
        frames = log_frames(api, finished.id, None, timestamps, follow=False, runs=runs)
        return [(line.stream, line.text, line.ts_ns) for line in
                lines_of(frames, timestamps=timestamps)]

    frames_read = read(runs=False)
    runs_read = read(runs=True)
    assert runs_read == frames_read
    texts = [text for _, text, _ in runs_read]
    assert len(texts) == 3000 + 6 + 1
    # Whole, its pieces' stamps gone (Docker orders stdout and stderr apart: by content).
    assert texts.count("x" * 40_000 + "é" * 9_000) == 6
    assert [t for s, t, _ in runs_read if s == "stdout"][-1] == "the last, unended"
    assert ("stderr", "line 7 ünï ✓") in [(s, t) for s, t, _ in runs_read]
    if timestamps:
        assert all(ts is not None for _, _, ts in runs_read)
