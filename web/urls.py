from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, JsonResponse
from django.urls import include, path


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("web.api.urls")),
    path("healthz", healthz, name="healthz"),
    path("benchmarks/", include("web.benchmarks.urls")),
    path("account/", include("web.accounts.urls")),
    path("", include("web.deployments.urls")),
]
