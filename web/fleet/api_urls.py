"""The fleet's API under /api/fleet/: people's (tokens, hosts) and hosts' own (join,
heartbeat, the ingest of events), which take a host's credential and nothing else."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from . import api, hostapi

# No root view (the panel's API root lists its own), no ".json" suffixes (JSON only).
router = SimpleRouter()
router.register("tokens", api.JoinTokenViewSet, basename="fleet-jointoken")
router.register("hosts", api.HostViewSet, basename="fleet-host")

urlpatterns = [
    path("join/", hostapi.host_join, name="fleet-join"),
    path("host/", hostapi.host_me, name="fleet-host-me"),
    path("host/heartbeat/", hostapi.host_heartbeat, name="fleet-heartbeat"),
    path("host/release/", hostapi.host_release, name="fleet-host-release"),
    path("host/deployments/<int:deployment_id>/events/", hostapi.host_events,
         name="fleet-host-events"),
    path("host/deployments/<int:deployment_id>/steps/", hostapi.host_step,
         name="fleet-host-steps"),
    path("host/deployments/<int:deployment_id>/metrics/", hostapi.host_metrics,
         name="fleet-host-metrics"),
    path("host/deployments/<int:deployment_id>/quiet/", hostapi.host_quiet,
         name="fleet-host-quiet"),
    path("", include(router.urls)),
]
