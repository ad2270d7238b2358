"""The engine agent: the long-running process per GPU host that owns its engine containers
(`python3 -m worker.agent`, the compose `agent` service).

controller.py is its loop (claim, follow, stop, re-queue builds, report the host);
engines.py what it starts (the container plan, identity, progress folding); monitoring.py
the metrics scrape and alerts beside each engine. It writes through web/deployments/services
(lifecycle.py for every status move); nothing in web/deployments imports it.
"""
