from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.decorators.http import require_safe


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@require_safe
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers and tools that ask /favicon.ico without reading the page's <link rel=icon>."""
    return HttpResponseRedirect(static("appliance/favicon.svg"))


urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("web.api.urls")),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("benchmarks/", include("web.benchmarks.urls")),
    path("keys/", include("web.gateway.urls")),
    path("models/", include("web.store.urls")),
    path("fleet/", include("web.fleet.urls")),
    path("account/", include("web.accounts.urls")),
    path("", include("web.deploy.urls")),
]
