from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated
from rest_framework.routers import DefaultRouter

from web.benchmarks.api import BenchmarkViewSet
from web.benchmarks.tune_api import TuneViewSet, deployment_tune
from web.benchmarks.verification_api import VerificationViewSet
from web.gateway.api import ApiKeyViewSet
from web.store.api import ModelEntryViewSet

from . import hosts, views


# No ".json" suffix routes: the API speaks JSON only, and the viewset's actions take no
# format argument (a suffixed URL was a 500).
class JSONRouter(DefaultRouter):
    include_format_suffixes = False


router = JSONRouter()
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("benchmarks", BenchmarkViewSet, basename="benchmark")
router.register("keys", ApiKeyViewSet, basename="apikey")
router.register("models", ModelEntryViewSet, basename="model")
router.register("verifications", VerificationViewSet, basename="verification")
router.register("tunes", TuneViewSet, basename="tune")


def _with_status_reads(patterns: list[URLPattern | URLResolver],
                       ) -> list[URLPattern | URLResolver]:
    """The router's patterns, the status reads' views taking token GETs short
    (views.status_read); same URLs, names and viewsets, so reverse() and the schema are
    unchanged."""
    return [URLPattern(p.pattern, views.status_read(p.name, p.callback), p.default_args,
                       p.name)
            if isinstance(p, URLPattern) and p.name in views.STATUS_READS else p
            for p in patterns]


urlpatterns = [
    path("deployments/<int:pk>/tune/", deployment_tune, name="deployment-tune"),
    path("", include(_with_status_reads(router.urls))),
    path("preflight/", views.preflight, name="preflight"),
    path("fleet/", include("web.fleet.api_urls")),
    path("hosts/", hosts.host_list, name="hosts"),
    # The schema names every endpoint and field: for logged-in users only.
    path("schema/", SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]),
         name="schema"),
    # GET only: its HTML renderer has no page for OPTIONS' metadata (a 500).
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema",
                                                 permission_classes=[IsAuthenticated],
                                                 http_method_names=["get", "head"]),
         name="docs"),
]
