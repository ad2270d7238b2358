"""Gateway API keys from the command line: create (the secret printed once), list, revoke.

    manage.py apikey create USERNAME NAME [--deployment ID ...] [--rate-limit N]
    manage.py apikey list [USERNAME]
    manage.py apikey revoke PREFIX
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from web.gateway import selectors, services


class Command(BaseCommand):
    help = "Create (secret shown once), list or revoke the gateway's API keys (sk-sd-...)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new key for an operator, printed once")
        create.add_argument("username")
        create.add_argument("name", help="what the key is for, e.g. 'ci-evals'")
        create.add_argument("--deployment", type=int, action="append", default=None,
                            metavar="ID", help="scope it to this deployment id (repeatable; "
                            "default: all deployments)")
        create.add_argument("--rate-limit", type=int, default=None, metavar="N",
                            help="requests per minute (default: no limit)")
        listing = sub.add_parser("list", help="keys by prefix, owner, scope and usage")
        listing.add_argument("username", nargs="?")
        revoke = sub.add_parser("revoke", help="revoke a key by its prefix (from list)")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            self._create(options)
        elif action == "list":
            self._list(options["username"])
        elif not services.apikey_revoke(prefix=options["prefix"]):
            raise CommandError(f"no unrevoked key with prefix {options['prefix']!r} "
                               "(`manage.py apikey list` shows them)")
        else:
            self.stdout.write(f"revoked {options['prefix']}")

    def _create(self, options: dict[str, Any]) -> None:
        try:
            made = services.apikey_create(
                owner_username=options["username"], name=options["name"],
                deployment_ids=options["deployment"],
                rate_limit_per_minute=options["rate_limit"])
        except services.ApiKeyError as exc:
            raise CommandError(f"{exc.field}: {exc}") from None
        self.stdout.write(made.secret)
        self.stderr.write(f"Key sk-sd-{made.key.prefix} ({made.key.name}) for "
                          f"{made.key.owner}; the secret above is shown only now.")

    def _list(self, username: str | None) -> None:
        owner = None
        if username:
            owner = get_user_model().objects.filter(username=username).first()
            if owner is None:
                raise CommandError(f"no user {username!r}")
        for key in selectors.apikey_list(owner=owner):
            state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
            used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
            self.stdout.write("\t".join([
                key.prefix, key.name, key.owner, key.scope,
                f"{key.rate_limit_per_minute}/min" if key.rate_limit_per_minute else "no limit",
                f"{key.requests} req {key.prompt_tokens}+{key.completion_tokens} tok",
                f"last used {used}", state]))
