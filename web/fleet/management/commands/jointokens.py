"""Join tokens for named hosts, written to files rather than printed:

    python3 manage.py jointokens --out /tokens sim-a sim-b

writes /tokens/<host>/token (0600) for each host that has not joined yet, for a host's
start to read (the GPU-less trial's one-shot service, docker/compose.trial.yaml). A token
never reaches the command's output or a log: only where each was written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from web.fleet import services
from web.fleet.models import FleetHost
from web.fleet.tokenfiles import token_file_write


class Command(BaseCommand):
    help = "Make a join token for each named host that has not joined; write each to a file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("hosts", nargs="+", help="the hosts' names (APPLIANCE_HOST_NAME)")
        parser.add_argument("--out", required=True,
                            help="a folder: each token goes to OUT/<host>/token")
        parser.add_argument("--ttl-hours", type=int, default=services.TOKEN_TTL_DEFAULT_H)

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        for name in options["hosts"]:
            if FleetHost.objects.joined().filter(name=name).exists():
                self.stdout.write(f"{name} has joined already: no token made")
                continue
            try:
                made = services.jointoken_create(host_name=name,
                                                 ttl_hours=options["ttl_hours"])
            except services.FleetError as exc:
                raise CommandError(f"{name}: {exc}") from None
            path = out / name / "token"
            token_file_write(path, made.secret)
            expires = made.token.expires_at.strftime("%Y-%m-%d %H:%M")
            self.stdout.write(f"a join token for {name} (expires {expires} UTC) is in {path}")
