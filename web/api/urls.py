from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated
from rest_framework.routers import DefaultRouter

from . import views

router = DefaultRouter()
router.register("deployments", views.DeploymentViewSet, basename="deployment")

urlpatterns = [
    path("", include(router.urls)),
    path("preflight/", views.preflight, name="preflight"),
    # The schema names every endpoint and field: for logged-in users only.
    path("schema/", SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]),
         name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema",
                                                 permission_classes=[IsAuthenticated]),
         name="docs"),
]
