import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
application = get_asgi_application()

from web.security import require_production_secrets  # noqa: E402 - needs settings loaded

require_production_secrets()
