"""Make the install's secrets once: `python3 -m web.initsecrets DIR` (compose's `init`).

Writes DIR/secret_key and DIR/db_password when missing (random, or the value of
APPLIANCE_SECRET_KEY / APPLIANCE_DB_PASSWORD when set), and never overwrites them:
the database was initialised with that password and sessions are signed with that key.
DIR/admin_password is the first admin's generated password (always random: one set in
.env reaches web directly and is never written here); web prints it at each start until
the admin first logs in (web/deployments/management/commands/bootstrap.py).
Standard library only: it runs before anything else is up.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# db_password is read by the database container's own user, so it is world-readable inside
# the volume, which only the appliance's containers mount.
FILES = {"secret_key": ("APPLIANCE_SECRET_KEY", 64, 0o600),
         "db_password": ("APPLIANCE_DB_PASSWORD", 32, 0o644),
         "admin_password": ("", 12, 0o600)}


def ensure(directory: Path) -> list[str]:
    """Create the missing secret files; the names of those made now."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for name, (env, size, mode) in FILES.items():
        path = directory / name
        if path.exists() and path.read_text().strip():
            continue
        value = (os.environ.get(env) if env else None) or secrets.token_urlsafe(size)
        path.write_text(value + "\n")
        path.chmod(mode)
        made.append(name)
    return made


def main(argv: list[str]) -> int:
    directory = Path(argv[0] if argv else "/var/lib/appliance/secrets")
    made = ensure(directory)
    print(f"appliance: secrets in {directory}: " + (f"made {', '.join(made)}" if made
                                                     else "already there, kept"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
