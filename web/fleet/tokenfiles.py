"""Join tokens kept in files for an agent to read, never printed: the trial's hosts'
(`manage.py jointokens --out`) and the panel's own host's (`manage.py ownhost`).

A token file is made readable by its owner only before a byte is in it, and written whole
then moved in place: an agent waiting on the file never reads half a token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.utils import timezone

from . import services
from .models import JoinToken
from .selectors import jointoken_state

# The own host's token file: settings.OWN_HOST_TOKEN_FILE (APPLIANCE_OWN_HOST_TOKEN_FILE).
# A token with this little left, or less, is replaced: the agent may need it for a re-join
# at any time until the next check (the panel loop runs ownhost hourly).
OWN_HOST_RENEW_BEFORE = timedelta(days=1)
OWN_HOST_TTL_H = 7 * 24


def token_file_write(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    os.chmod(partial, 0o600)  # a .part left by an older run keeps its own mode otherwise
    partial.replace(path)


@dataclass(frozen=True)
class KeptToken:
    token: JoinToken
    made: bool  # a new one was written (else the file's was usable and kept)
    why: str  # why a new one was made: the file's token missing, spent, revoked, expiring


def _file_token(path: Path, host_name: str) -> JoinToken | None:
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not secret:
        return None
    return JoinToken.objects.filter(digest=services.secret_digest(secret),
                                    host_name=host_name).first()


def own_host_token_keep(*, path: Path, host_name: str, ttl_hours: int = OWN_HOST_TTL_H,
                        now: datetime | None = None) -> KeptToken:
    """A usable join token for the panel's own host in `path`: the file's while it is usable
    for more than OWN_HOST_RENEW_BEFORE, else a new one (services.jointoken_create) written
    there, the replaced one revoked if it could still join (no file holds it any more).
    FleetError for a bad host name or ttl; OSError where the file cannot be read or written,
    and then no new token is left behind (one no file holds could join nothing, but would
    be listed as waiting for its host each time the write is tried again)."""
    name = services.host_name_checked(host_name)
    now = now or timezone.now()
    if ttl_hours * 3600 <= OWN_HOST_RENEW_BEFORE.total_seconds():
        raise services.FleetError("ttl_hours", "the own host's token must last more than "
                                  f"{OWN_HOST_RENEW_BEFORE.days} day: one with a day or less "
                                  "left is made again")
    kept = _file_token(path, name)
    state = jointoken_state(token=kept, now=now) if kept is not None else "missing"
    if kept is not None and state == "usable" and kept.expires_at - now > OWN_HOST_RENEW_BEFORE:
        return KeptToken(token=kept, made=False, why="")
    # Its row is written before the file holds it: an agent reading the file at once joins.
    made = services.jointoken_create(host_name=name, ttl_hours=ttl_hours)
    try:
        token_file_write(path, made.secret)
    except OSError:
        JoinToken.objects.filter(pk=made.token.pk).delete()  # no one holds its secret
        raise
    if kept is not None and state == "usable":
        services.jointoken_revoke(token_id=kept.pk)
    return KeptToken(token=made.token, made=True,
                     why="expires within a day" if state == "usable" else state)
