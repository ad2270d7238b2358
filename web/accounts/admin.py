"""Plain DRF tokens are gone (migrations/0001 hashed them): their admin could make new ones.
Hashed tokens are made and revoked in the admin's "Auth tokens" (knox), or `manage.py
apitoken`; the token is shown once, on creation."""

from django.contrib import admin
from rest_framework.authtoken.models import TokenProxy

if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
