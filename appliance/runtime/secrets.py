"""The secret store: the values of the secret names a spec declares (`secrets: [HF_TOKEN]`).

A value comes from the file <directory>/<NAME> (a compose secret, a mounted folder), else
from the starting process's environment as APPLIANCE_ENGINE_SECRET_<NAME>. It is read when
the engine container starts and put into that container, after it is created and before it
starts, as the files /run/appliance/secrets/<NAME> (mode 0400); the image's entrypoint
exports each as the variable <NAME> and removes the file before it runs the engine. So a
value is never in the container's configuration (`docker inspect`), an image layer, the
spec, an event, a log line or the plan shown in a dry run. Names are upper case (the
spec checks it), so no name reaches the appliance's own lower-case secret files.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path

# Where the files land in the container (docker/engine/runtime/entrypoint.py reads them).
CONTAINER_DIR = "run/appliance/secrets"
# Not APPLIANCE_SECRET_: APPLIANCE_SECRET_KEY is the panel's own signing key.
ENV_PREFIX = "APPLIANCE_ENGINE_SECRET_"
MAX_SECRET_BYTES = 64 * 1024
_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


class SecretMissingError(LookupError):
    """A declared secret is in neither place; the message names both, never a value."""


def _from_file(directory: str, name: str) -> str | None:
    if not directory:
        return None
    path = Path(directory) / name
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise SecretMissingError(f"secret {name} cannot be read from {path}: "
                                 f"{exc.strerror}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise SecretMissingError(f"secret {name} in {path} is over {MAX_SECRET_BYTES} bytes")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        # The codec's message quotes a byte of the value: say only what is wrong.
        raise SecretMissingError(f"secret {name} in {path} is not UTF-8 text") from None


def resolve_secrets(names: list[str], *, directory: str,
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """name -> value for each declared name; SecretMissingError naming every one missing."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        if not _NAME.fullmatch(name):
            raise SecretMissingError(f"{name!r} is not a secret name")
        value = _from_file(directory, name)
        if value is None:
            value = environ.get(ENV_PREFIX + name)
        if value:
            values[name] = value
        else:
            missing.append(name)
    if missing:
        # Named as the host sees the store: compose mounts ./engine-secrets at `directory`.
        raise SecretMissingError(
            f"secret {', '.join(missing)} is not in the secret store: put it in the file "
            f"./engine-secrets/<NAME> on the host (APPLIANCE_ENGINE_SECRETS_HOST_DIR; the "
            f"agent reads it at {directory or 'APPLIANCE_ENGINE_SECRETS_DIR'}) or set "
            f"{ENV_PREFIX}<NAME> in the engine agent's environment")
    return values


def secret_names_available(*, directory: str,
                           environ: Mapping[str, str] | None = None) -> list[str]:
    """The names the store holds (never a value): a non-empty file in the directory, or a
    set APPLIANCE_ENGINE_SECRET_<NAME>. Pre-flight checks a spec's `secrets:` against it."""
    environ = os.environ if environ is None else environ
    names = {key.removeprefix(ENV_PREFIX) for key, value in environ.items()
             if key.startswith(ENV_PREFIX) and value}
    try:
        entries = list(Path(directory).iterdir()) if directory else []
    except OSError:
        entries = []  # no store folder: only the environment's names
    for entry in entries:
        try:
            if _NAME.fullmatch(entry.name) and entry.is_file() and entry.stat().st_size > 0:
                names.add(entry.name)
        except OSError:
            continue  # unreadable entry: the start names it when it needs it
    return sorted(n for n in names if _NAME.fullmatch(n))


def secrets_archive(values: Mapping[str, str]) -> bytes:
    """A tar for `put_archive("/", ...)`: CONTAINER_DIR (0700) with one 0400 file per
    name, owned by root; empty bytes when there is nothing to put."""
    if not values:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in ("run/appliance", CONTAINER_DIR):
            folder = tarfile.TarInfo(path)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755 if path == "run/appliance" else 0o700
            tar.addfile(folder)
        for name, value in sorted(values.items()):
            data = value.encode("utf-8")
            info = tarfile.TarInfo(f"{CONTAINER_DIR}/{name}")
            info.size, info.mode = len(data), 0o400
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
