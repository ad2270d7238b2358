#!/usr/bin/env python3
"""Engine container entrypoint: optional GPU self-check, then exec the engine argv.

argv is the engine command as a list (never a shell string), e.g.
`python3 -m sglang.launch_server --model-path ...`. With APPLIANCE_GPU_CHECK=1 the
self-check (/opt/appliance/selfcheck.pyz, the appliance.selfcheck package as a zip
application) runs first, with APPLIANCE_GPU_CHECK_ARGS
(JSON list) as its arguments and --stream, so a bad GPU, driver, NCCL or graph width is
found in seconds instead of after the model load, and every result reaches the panel as
it happens. A failed check exits with its status and the engine never starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

GPUCHECK = "/opt/appliance/selfcheck.pyz"


def check_argv() -> list[str]:
    raw = os.environ.get("APPLIANCE_GPU_CHECK_ARGS", "[]")
    extra = json.loads(raw)
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise SystemExit("APPLIANCE_GPU_CHECK_ARGS must be a JSON list of strings")
    return [sys.executable, GPUCHECK, "--stream", *extra]


def run_gpu_check() -> int:
    print("appliance: GPU self-check begin", flush=True)
    if os.path.exists(GPUCHECK):
        rc = subprocess.run(check_argv(), check=False).returncode
    else:
        print(f"appliance: APPLIANCE_GPU_CHECK=1 but {GPUCHECK} is not in this image",
              file=sys.stderr, flush=True)
        rc = 2
    print(f"appliance: GPU self-check end rc={rc}", flush=True)
    return rc


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: entrypoint.py <engine argv...>", file=sys.stderr)
        return 2
    if os.environ.get("APPLIANCE_GPU_CHECK") == "1":
        rc = run_gpu_check()
        if rc != 0:
            return rc
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # replaces this process: signals go straight to the engine


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
