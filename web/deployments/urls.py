from django.urls import path

from . import history_views, prom, sse, views

app_name = "deployments"

urlpatterns = [
    path("", views.deployment_list, name="list"),
    path("deployments/new/", views.deployment_new, name="new"),
    path("hosts/", views.host_list, name="hosts"),
    path("deployments/rows/", views.deployment_list_rows, name="list-rows"),
    path("deployments/<int:pk>/", views.deployment_detail, name="detail"),
    path("deployments/<int:pk>/stop/", views.deployment_stop, name="stop"),
    path("deployments/<int:pk>/events/stream/", sse.deployment_event_stream, name="stream"),
    path("deployments/<int:pk>/events/", history_views.deployment_events, name="events"),
    path("deployments/<int:pk>/log.txt", history_views.deployment_log_download, name="log"),
    # Prometheus (bearer token or a viewer's login; web/deployments/prom.py).
    path("metrics", prom.prometheus_metrics, name="prometheus"),
]
