"""API tokens from the command line: create (shown once), list, revoke.

    manage.py apitoken create USERNAME [--role viewer|operator] [--days N]
    manage.py apitoken list [USERNAME]
    manage.py apitoken revoke KEY
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from web.accounts import tokens


class Command(BaseCommand):
    help = "Create (shown once), list or revoke hashed API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new token for a user, printed once")
        create.add_argument("username")
        create.add_argument("--role", choices=["viewer", "operator"], default=None,
                            help="what the token may do (default: the user's largest role)")
        create.add_argument("--days", type=int, default=None,
                            help="expires after this many days (0: never); default "
                                 "APPLIANCE_API_TOKEN_TTL_DAYS")
        listing = sub.add_parser("list", help="tokens by key, user, creation and expiry")
        listing.add_argument("username", nargs="?")
        revoke = sub.add_parser("revoke", help="revoke a token by its key (from list)")
        revoke.add_argument("key")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            try:
                row, token = tokens.token_create(username=options["username"],
                                                 role=options["role"], ttl_days=options["days"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"no user {options['username']!r}") from None
            except tokens.TokenRoleError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(token)
            self.stderr.write(f"Token {row.token_key} ({row.scope.role}) for {row.user}; it "
                              "is shown only now "
                              f"(expires {row.expiry or 'never'}).")
        elif action == "list":
            for row in tokens.token_list(username=options["username"]):
                self.stdout.write(f"{row.token_key}\t{row.user}\t{row.created:%Y-%m-%d %H:%M}"
                                  f"\t{row.expiry or 'never'}")
        elif not tokens.token_revoke(key=options["key"]):
            raise CommandError(f"no token with key {options['key']!r}")
        else:
            self.stdout.write(f"revoked {options['key']}")
