"""Thin tasks: a primary key in, one service call."""

from __future__ import annotations

from web.deployments import services

from .celery import app


@app.task(name="worker.tasks.deploy", acks_late=True)
def deploy(deployment_id: int) -> str:
    return services.deployment_run(deployment_id=deployment_id)


@app.task(name="worker.tasks.stop", acks_late=True)
def stop(deployment_id: int) -> str:
    return services.deployment_stop(deployment_id=deployment_id)


@app.task(name="worker.tasks.supervise", ignore_result=True)
def supervise() -> int:
    return services.deployments_supervise()
