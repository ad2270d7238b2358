"""A usable join token for the panel's own host, kept in a file for its agent:

    python3 manage.py ownhost [--out /var/lib/appliance/own-host/token]

makes one (for APPLIANCE_HOST_NAME) when the file is missing or its token is spent, revoked
or expires within a day, else keeps it; the agent reads the file (APPLIANCE_JOIN_TOKEN_FILE)
when it must join. The panel loop does the same at its start and hourly (web/loop.py), into
settings.OWN_HOST_TOKEN_FILE (APPLIANCE_OWN_HOST_TOKEN_FILE), this command's default. The
token never reaches the command's output or a log: only the file's path and the token's
expiry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from web.fleet import services
from web.fleet.tokenfiles import OWN_HOST_TTL_H, own_host_token_keep


class Command(BaseCommand):
    help = "Keep a usable join token for this panel's own host in a file its agent reads."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default=settings.OWN_HOST_TOKEN_FILE,
                            help="the token's file (default APPLIANCE_OWN_HOST_TOKEN_FILE, "
                                 f"{settings.OWN_HOST_TOKEN_FILE})")
        parser.add_argument("--host", default=settings.HOST_NAME,
                            help="the own host's name (default APPLIANCE_HOST_NAME)")
        parser.add_argument("--ttl-hours", type=int, default=OWN_HOST_TTL_H,
                            help=f"a new token's life, over 24 (default {OWN_HOST_TTL_H})")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["out"])
        try:
            kept = own_host_token_keep(path=path, host_name=options["host"],
                                       ttl_hours=options["ttl_hours"])
        except services.FleetError as exc:
            raise CommandError(f"{exc.field}: {exc}") from None
        except OSError as exc:
            raise CommandError(f"the token file {path}: {exc.strerror}") from None
        host = kept.token.host_name
        expires = kept.token.expires_at.strftime("%Y-%m-%d %H:%M")
        if kept.made:
            self.stdout.write(f"a join token for {host} (expires {expires} UTC) is in {path} "
                              f"(the one there was {kept.why})")
        else:
            self.stdout.write(f"the join token for {host} in {path} is usable until "
                              f"{expires} UTC: kept")
