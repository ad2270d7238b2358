from django.urls import path

from web.deployments import history_views, prom, sse
from web.gateway import playground_views
from web.store import loadtime_views

from . import lifecycle_views, views

app_name = "deployments"

urlpatterns = [
    path("", views.deployment_list, name="list"),
    path("deployments/new/", views.deployment_new, name="new"),
    path("hosts/", views.host_list, name="hosts"),
    # The store page's Measure button (a root's read rate; web/store/loadtime.py).
    path("store/read-rate/", loadtime_views.root_read_rate, name="read-rate"),
    path("deployments/rows/", views.deployment_list_rows, name="list-rows"),
    path("deployments/<int:pk>/", views.deployment_detail, name="detail"),
    path("deployments/<int:pk>/agent/", views.deployment_agent, name="agent"),
    path("deployments/<int:pk>/playground/", playground_views.deployment_playground,
         name="playground"),
    path("deployments/<int:pk>/stop/", lifecycle_views.deployment_stop, name="stop"),
    path("deployments/<int:pk>/restart/", lifecycle_views.deployment_restart, name="restart"),
    path("deployments/<int:pk>/scale/", lifecycle_views.deployment_scale, name="scale"),
    path("deployments/<int:pk>/delete/", lifecycle_views.deployment_delete, name="delete"),
    path("deployments/<int:pk>/runs/<int:number>/log.txt", lifecycle_views.deployment_run_log,
         name="run-log"),
    path("deployments/<int:pk>/events/stream/", sse.deployment_event_stream, name="stream"),
    path("deployments/<int:pk>/events/", history_views.deployment_events, name="events"),
    path("deployments/<int:pk>/log.txt", history_views.deployment_log_download, name="log"),
    # Prometheus (bearer token or a viewer's login; web/deployments/prom.py).
    path("metrics", prom.prometheus_metrics, name="prometheus"),
]
