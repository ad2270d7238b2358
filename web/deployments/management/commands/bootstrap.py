"""Create the role groups and, once, the first admin account.

The admin's password comes from APPLIANCE_ADMIN_PASSWORD (or _FILE); when it is
unset a random one is generated and printed once, on the first start only.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand

from web.settings import env_str

ROLES = {
    "operator": ["add_deployment", "change_deployment", "view_deployment"],
    "viewer": ["view_deployment"],
}


class Command(BaseCommand):
    help = "Create role groups (operator, viewer) and the first admin account."

    def handle(self, *args: Any, **options: Any) -> None:
        for role, codenames in ROLES.items():
            group, _ = Group.objects.get_or_create(name=role)
            group.permissions.set(Permission.objects.filter(codename__in=codenames))
        user_model = get_user_model()
        if user_model.objects.filter(is_superuser=True).exists():
            return
        username = env_str("APPLIANCE_ADMIN_USER", "admin")
        password = env_str("APPLIANCE_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                f"Created admin account {username!r} with password {password!r}. "
                "It is printed once; change it after logging in."
            )
        else:
            self.stdout.write(f"Created admin account {username!r} from the environment.")
