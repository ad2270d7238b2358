"""Deploying: what spans web's apps, and the deployment pages that drive it.

A spec is validated, placed on the fleet (web/fleet/placement.py), pre-flighted against the
model store's entries (web/store/loadtime.py) and the chosen host's facts, and its rows made
(services.py: create, redeploy, run alone, scale); the pages (views.py, lifecycle_views.py)
show a deployment with what the gateway and the store say of it. It stands above
web/deployments, web/fleet, web/store and web/gateway, and none of them imports it.
"""
