"""A host agent's configuration (appliance/runtime/remote_agent.py): its environment read
and checked, each bad value named with the fix, and the join token it joins with."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CREDENTIAL_PATH = "/var/lib/appliance/host-credential/credential"  # a volume (compose.host.yaml)


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name} is a whole number, not {raw!r}") from None


def _env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in {"1", "0", "true", "false", "yes", "no"}:
        raise SystemExit(f"{name} is true or false, not {raw!r}")
    return raw in {"1", "true", "yes"}


@dataclass(frozen=True)
class RemoteSettings:
    """The remote agent's configuration: environment variables, the panel's names.

    With `engine_network` (a compose install's own host) engines sit on that Docker network,
    reached by container name, and nothing is published: `advertise_addr` is then unused."""

    panel_url: str
    host_name: str
    advertise_addr: str
    join_token: str = field(default="", repr=False)
    credential_path: Path = Path(CREDENTIAL_PATH)
    engine_network: str = ""
    models_dir: str = ""
    secrets_dir: str = "/run/secrets/engine"
    gpu_requests: bool = True
    gpu_check: bool = True
    gpu_count: int = 0  # the GPUs to report where NVML is missing
    shm_size: str = "32g"
    pids_limit: int = 8192
    memory_limit: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    stop_timeout_s: int = 30
    ready_timeout_s: int = 3600
    tick_s: float = 1.0
    recipes_dir: str = ""  # the site's recipes, as the panel's APPLIANCE_RECIPES_DIR
    build_ca_bundle: str = ""  # a proxy's CA for the image builds' download steps

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RemoteSettings:
        env = os.environ if environ is None else environ
        network = env.get("APPLIANCE_ENGINE_NETWORK", "")
        needed = ["APPLIANCE_PANEL_URL", "APPLIANCE_HOST_NAME"]
        if not network:  # published engines: the panel needs their address
            needed.append("APPLIANCE_HOST_ADVERTISE_ADDR")
        missing = [n for n in needed if not env.get(n)]
        if missing:
            raise SystemExit(f"set {', '.join(missing)}: a fleet host's agent needs the "
                             "panel's address, its own name and the address the panel "
                             "reaches its engines at, unless they sit on an engine network "
                             "(APPLIANCE_ENGINE_NETWORK) (docs/fleet.md)")
        extra = [item.split("=", 1) for item in env.get("APPLIANCE_ENGINE_EXTRA_ENV", "")
                 .split(",") if "=" in item]
        credential_path = Path(env.get("APPLIANCE_HOST_CREDENTIAL_FILE", CREDENTIAL_PATH))
        token = env.get("APPLIANCE_JOIN_TOKEN", "")
        token_file = env.get("APPLIANCE_JOIN_TOKEN_FILE", "")
        if not token and token_file:
            # With a stored credential the token is only a fallback: read, never waited for.
            stored = credential_path.is_file() and credential_path.stat().st_size > 0
            wait_s = 0 if stored else _env_int(env, "APPLIANCE_JOIN_TOKEN_WAIT_S",
                                                  JOIN_TOKEN_WAIT_S)
            token = join_token_read(Path(token_file), wait_s=wait_s)
            if not token and not stored:
                raise SystemExit(f"no join token in {token_file} after {wait_s} s and no "
                                 f"stored credential in {credential_path}: the panel writes "
                                 "one there (manage.py ownhost, or jointokens --out)")
        return cls(
            panel_url=env["APPLIANCE_PANEL_URL"], host_name=env["APPLIANCE_HOST_NAME"],
            advertise_addr=env.get("APPLIANCE_HOST_ADVERTISE_ADDR", ""),
            join_token=token, credential_path=credential_path, engine_network=network,
            models_dir=env.get("APPLIANCE_MODELS_DIR", ""),
            secrets_dir=env.get("APPLIANCE_ENGINE_SECRETS_DIR", "/run/secrets/engine"),
            gpu_requests=_env_bool(env, "APPLIANCE_ENGINE_GPU_REQUESTS", True),
            gpu_check=_env_bool(env, "APPLIANCE_ENGINE_GPU_CHECK", True),
            gpu_count=_env_int(env, "APPLIANCE_GPU_COUNT", 0),
            shm_size=env.get("APPLIANCE_ENGINE_SHM_SIZE", "32g"),
            pids_limit=_env_int(env, "APPLIANCE_ENGINE_PIDS_LIMIT", 8192),
            memory_limit=env.get("APPLIANCE_ENGINE_MEMORY_LIMIT", ""),
            extra_env={k.strip(): v for k, v in extra},
            stop_timeout_s=_env_int(env, "APPLIANCE_ENGINE_STOP_TIMEOUT_S", 30),
            ready_timeout_s=_env_int(env, "APPLIANCE_ENGINE_READY_TIMEOUT_S", 3600),
            tick_s=float(_env_int(env, "APPLIANCE_AGENT_TICK_MS", 1000)) / 1000,
            recipes_dir=env.get("APPLIANCE_RECIPES_DIR", ""),
            build_ca_bundle=env.get("APPLIANCE_BUILD_CA_BUNDLE", ""))


JOIN_TOKEN_WAIT_S = 120  # how long the agent waits for its join token file by default
JOIN_TOKEN_POLL_S = 0.2


def join_token_read(path: Path, *, wait_s: float) -> str:
    """The join token in `path` once it is there and not empty, looked for up to `wait_s`
    (the panel's side writes it whole, then renames it in place); '' when none came. The
    token itself is never logged or put in the environment."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        except OSError as exc:
            raise SystemExit(f"cannot read the join token file {path}: {exc.strerror}") from None
        if token or time.monotonic() >= deadline:
            return token
        time.sleep(min(JOIN_TOKEN_POLL_S, max(deadline - time.monotonic(), 0.0)))
