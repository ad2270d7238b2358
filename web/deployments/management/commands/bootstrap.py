"""Create the role groups and, once, the first admin account.

The admin's password comes from APPLIANCE_ADMIN_PASSWORD, else from the file that
APPLIANCE_ADMIN_PASSWORD_FILE names (compose: the one `init` generated in the secrets
volume). A kept password is printed at every start until the admin first logs in, so a
recreated `web` container (any .env change) does not lose it; after that only the reset
command helps. With neither (a bare `manage.py`), a random one is printed once.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand

from web.envsettings import env_str

ROLES = {
    "operator": ["add_deployment", "change_deployment", "delete_deployment", "view_deployment"],
    "viewer": ["view_deployment"],
}


class Command(BaseCommand):
    help = "Create role groups (operator, viewer) and the first admin account."

    def handle(self, *args: Any, **options: Any) -> None:
        for role, codenames in ROLES.items():
            group, _ = Group.objects.get_or_create(name=role)
            group.permissions.set(Permission.objects.filter(codename__in=codenames))
        user_model = get_user_model()
        username = env_str("APPLIANCE_ADMIN_USER", "admin")
        from_env = os.environ.get("APPLIANCE_ADMIN_PASSWORD", "")
        kept = "" if from_env else _kept_password()
        if not user_model.objects.filter(is_superuser=True).exists():
            self._create_admin(username, from_env or kept)
        if kept:
            self._remind(username, kept)

    def _create_admin(self, username: str, password: str) -> None:
        if password:
            get_user_model().objects.create_superuser(username=username, email="",
                                                      password=password)
            self.stdout.write(f"Created admin account {username!r}.")
            return
        password = secrets.token_urlsafe(12)
        get_user_model().objects.create_superuser(username=username, email="",
                                                  password=password)
        self.stdout.write(f"Created admin account {username!r} with password {password!r}. "
                          "It is printed once (no secrets folder to keep it in); change it "
                          "after logging in.")

    def _remind(self, username: str, kept: str) -> None:
        """The kept password, while it still opens the account and nobody has used it."""
        admin = get_user_model().objects.filter(username=username, is_superuser=True).first()
        if admin is None or admin.last_login is not None or not admin.check_password(kept):
            return
        self.stdout.write(
            f"Admin account {username!r} password: {kept!r} (printed at each start until "
            f"its first login). Reset it: docker compose exec web python3 manage.py "
            f"changepassword {username}")


def _kept_password() -> str:
    path = os.environ.get("APPLIANCE_ADMIN_PASSWORD_FILE", "")
    try:
        return Path(path).read_text().strip() if path else ""
    except OSError:  # not made yet (an install from before this file existed)
        return ""
