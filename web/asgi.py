import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup(set_prefix=False)

from web.serving import django_application  # noqa: E402 - needs the apps loaded

# /v1 (the OpenAI-compatible gateway, web/gateway/proxy.py) is answered before Django's
# middleware; everything else is Django's.
# Sync views are served by Django's WSGI handler, async ones by its ASGI one (web/serving.py).
_django = django_application()

from web.deployments.sse import with_stream_sockets  # noqa: E402 - needs the apps loaded

# An event stream's socket holds at most 64 KiB unsent (web/deployments/sse.py): a
# background tab's stream then waits after that, not after 4 MiB written to it.
_django = with_stream_sockets(_django)

from web.api.asgi import with_status_reads  # noqa: E402 - needs the apps loaded
from web.fleet.asgi import with_host_ingest  # noqa: E402 - needs the apps loaded
from web.gateway.proxy import with_gateway  # noqa: E402 - needs the apps loaded

# A token GET of a deployment's detail or summary too (web/api/asgi.py), with Django's
# own answer's headers; everything it is unsure of is Django's. A host's batch of events
# (web/fleet/asgi.py) too, with the view's own checks and answers.
application = with_gateway(with_host_ingest(with_status_reads(_django)))

from web.security import require_production_secrets  # noqa: E402 - needs settings loaded

require_production_secrets()

from web.accesslog import quiet_access_log  # noqa: E402 - uvicorn's logging is set up by now

# The hosts' own successful API calls stay out of the access log (web/accesslog.py).
quiet_access_log()

from appliance import collector  # noqa: E402 - settled once all of the above is made

# What the imports made (Django's apps, URL patterns, templates) lives as long as the process:
# kept out of the collector's full passes, which otherwise walk it all, mid-request; and the
# young passes spaced out for the log path's batches (appliance/collector.py).
collector.settle()
