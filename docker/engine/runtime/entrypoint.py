#!/usr/bin/env python3
"""Engine container entrypoint: optional GPU self-check, then exec the engine argv.

argv is the engine command as a list (never a shell string), e.g.
`python3 -m sglang.launch_server --model-path ...`. With APPLIANCE_GPU_CHECK=1 the
self-check (/opt/appliance/selfcheck.pyz, the appliance.selfcheck package as a zip
application) runs first, with APPLIANCE_GPU_CHECK_ARGS
(JSON list) as its arguments and --stream, so a bad GPU, driver, NCCL or graph width is
found in seconds instead of after the model load, and every result reaches the panel as
it happens. A failed check exits with its status and the engine never starts.

Secrets come first: the engine agent puts each declared secret into the created container
as the file /run/appliance/secrets/<NAME> (never as container configuration, which
`docker inspect` shows); each becomes the variable <NAME> here, the file is removed, and
APPLIANCE_SECRET_NAMES lists the names (never a value).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

GPUCHECK = "/opt/appliance/selfcheck.pyz"
SECRETS_DIR = "/run/appliance/secrets"
API_KEY_SECRET = "APPLIANCE_ENGINE_API_KEY"  # appliance.runtime.containers.ENGINE_API_KEY_SECRET
_SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def load_secrets(directory: str = SECRETS_DIR) -> list[str]:
    """Export each secret file as an environment variable of its name, then remove it."""
    try:
        names = sorted(n for n in os.listdir(directory) if _SECRET_NAME.fullmatch(n))
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as handle:
            os.environ[name] = handle.read()
        os.remove(path)  # not left for `docker cp` or `docker export` of the container
    if names:
        os.environ["APPLIANCE_SECRET_NAMES"] = ",".join(names)
        print(f"appliance: {len(names)} secret(s) set: {', '.join(names)}", flush=True)
    return names


def with_api_key(argv: list[str]) -> list[str]:
    """A fleet host's engine is published on the host's network, so it is started with
    SGLang's --api-key (the gateway sends it); the key came as a secret file, so it is in no
    container configuration, and it leaves the environment before the engine runs."""
    key = os.environ.pop(API_KEY_SECRET, "")
    if not key:
        return argv
    os.environ["APPLIANCE_SECRET_NAMES"] = ",".join(
        n for n in os.environ.get("APPLIANCE_SECRET_NAMES", "").split(",")
        if n and n != API_KEY_SECRET)
    return [*argv, "--api-key", key]


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
    load_secrets()
    argv = with_api_key(argv)
    if os.environ.get("APPLIANCE_GPU_CHECK") == "1":
        rc = run_gpu_check()
        if rc != 0:
            return rc
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # replaces this process: signals go straight to the engine


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
