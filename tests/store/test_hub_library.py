"""Why the store fetches files with http_get and its own .incomplete part: huggingface_hub's
hf_hub_download (2.4.0, the pinned one) writes to a part named per process and removes it
on failure, so after a kill the next call starts that file from zero. Shown here on a real
process killed mid-file; if a later version resumes, this test says so and the store could
use it instead. It also checks the local hub speaks HEAD as hf_hub_download asks it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.store.hubserver import HubServer, small_repo

SHARD = "model-00001-of-00002.safetensors"
# Small read chunks (10 MiB by default), so the killed part really holds bytes.
FETCH = ("import sys; from huggingface_hub import constants, hf_hub_download; "
         "constants.DOWNLOAD_CHUNK_SIZE = 16384; print(hf_hub_download('acme/tiny-llama', sys.argv[1], cache_dir=sys.argv[2], "
         "endpoint=sys.argv[3]))")


def _fetch(hub: HubServer, cache: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.Popen([sys.executable, "-c", FETCH, SHARD, str(cache), hub.url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_hf_hub_download_starts_a_killed_file_again_from_zero(tmp_path: Path) -> None:
    repo = small_repo(shard_bytes=1024 * 1024)
    with HubServer(repo) as hub:
        hub.state.rate = 300_000
        first = _fetch(hub, tmp_path)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            parts = list(tmp_path.rglob("*.incomplete"))
            if parts and parts[0].stat().st_size > 200_000:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("hf_hub_download never got mid-file")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        hub.state.rate = None
        second = _fetch(hub, tmp_path)
        out = second.communicate(timeout=60)[0].decode()
        assert second.returncode == 0, out
    assert Path(out.strip().splitlines()[-1]).read_bytes() == repo.files[SHARD]
    assert [r.method for r in hub.state.requests if r.path.endswith(SHARD)] == \
        ["HEAD", "GET", "HEAD", "GET"]
    assert hub.state.ranges(SHARD) == [None, None]  # the second GET: the whole file again
