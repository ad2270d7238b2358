import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
# /v1 (the OpenAI-compatible gateway, web/gateway/proxy.py) is answered before Django's
# middleware; everything else is Django's.
_django = get_asgi_application()

from web.gateway.proxy import with_gateway  # noqa: E402 - needs the apps loaded

application = with_gateway(_django)

from web.security import require_production_secrets  # noqa: E402 - needs settings loaded

require_production_secrets()
