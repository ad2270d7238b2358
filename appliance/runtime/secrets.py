"""The secret store: the values of the secret names a spec declares (`secrets: [HF_TOKEN]`).

A value comes from the file <directory>/<NAME> (a compose secret, a mounted folder), else
from the starting process's environment as APPLIANCE_ENGINE_SECRET_<NAME>. It is read when
the engine container starts and handed to that container's environment only: never to
the spec, an event, a log line or the plan shown in a dry run. Names are upper case (the
spec checks it), so no name reaches the appliance's own lower-case secret files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

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
        where = f"a file {directory}/<NAME>" if directory else "a secrets directory"
        raise SecretMissingError(
            f"secret {', '.join(missing)} is not in the secret store: put it in {where} "
            f"(APPLIANCE_ENGINE_SECRETS_DIR) or set {ENV_PREFIX}<NAME> in the engine agent's "
            "environment")
    return values
