"""What the status reads return: the fields each shows, its ETag and its JSON
body, made from the deployment row alone. One module, with nothing of the views', so the
row's writers (services/reads.py) render the very bytes a read answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone
from django.utils.http import quote_etag
from rest_framework.renderers import JSONRenderer

from . import selectors
from .models import Deployment
from .serializers import DeploymentSerializer, deployment_data
from .silence import Silence, row_silence, shown_body

# The columns each status read shows (a profile, docs/performance.md: decoding the row's
# other JSON columns was a fifth of the row's cost); a deferred one read anyway would be a
# query more, which tests/api/test_status_api_queries.py counts.
READ_FIELDS = {
    "retrieve": tuple(DeploymentSerializer.Meta.fields),
    "summary": ("name", "status", "phase", "progress", "decode_stats", "diagnosis", "alerts",
                "alert_history", "latest_metrics", "engine_url", "last_seq", "graph_needed",
                "load_estimate", "image"),
}
# What the silence check reads besides (status_silence): the viewset loads them too.
WATCH_FIELDS = ("status", "agent_id")
# Both reads' columns: what a writer loads to render both bodies from one version.
BOTH_FIELDS = tuple(dict.fromkeys(READ_FIELDS["retrieve"] + READ_FIELDS["summary"]))

# The status reads a dashboard polls, by the router's URL name: the viewset's action, the
# ETag's name and the body.
STATUS_READS: dict[str, tuple[str, str, Callable[[Deployment], Any]]] = {
    "deployment-detail": ("retrieve", "detail", deployment_data),
    "deployment-summary": ("summary", "summary",
                           lambda d: selectors.deployment_summary(deployment=d)),
}
_JSON = JSONRenderer()


def status_etag(*, deployment: Deployment, name: str,
                silence: Silence | None = None) -> str | None:
    """The quoted ETag of a representation made of the row alone (and, while its agent is
    silent, of that silence), from its version; None where the database keeps none."""
    version = selectors.deployment_row_version(deployment=deployment)
    return None if version is None else status_etag_of(pk=deployment.pk, version=version,
                                                       name=name, silence=silence)


def status_etag_of(*, pk: int, version: str, name: str, silence: Silence | None = None) -> str:
    """status_etag from the deployment's id and row version: a silence that begins or ends
    changes it, as the body does, though the row did not change."""
    if silence is not None:
        return quote_etag(f"{name}-{pk}-{version}-silent-{silence.last_seen.timestamp():.0f}")
    return quote_etag(f"{name}-{pk}-{version}")


def status_silence(*, deployment: Deployment) -> Silence | None:
    """The silence of the agent watching the row, as its read found it: the status
    statement's (web/api/selectors.py), or from the columns and the `agent_seen` annotation
    the viewset's queryset reads (one query, the row's)."""
    if hasattr(deployment, "shown_silence"):
        return deployment.shown_silence  # type: ignore[no-any-return]
    return row_silence(status=deployment.status, agent_id=deployment.agent_id,
                       last_seen=getattr(deployment, "agent_seen", None), now=timezone.now())


def status_body(*, deployment: Deployment, url_name: str,
                silence: Silence | None = None) -> Any:
    """A status read's body: the row's representation, `unknown` while its agent is
    silent (web/deployments/silence.py shown_body)."""
    return shown_body(STATUS_READS[url_name][2](deployment), silence)


def status_body_render(*, deployment: Deployment, url_name: str,
                       silence: Silence | None = None) -> bytes:
    """The JSON body of a status read's 200, as DRF renders it for a plain JSON Accept."""
    return _JSON.render(status_body(deployment=deployment, url_name=url_name,
                                    silence=silence), _JSON.media_type, {})
