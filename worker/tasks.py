"""Thin tasks: a primary key in, one service call."""

from __future__ import annotations

from web.deployments import services

from .celery import app


# A deploy builds (or finds) the image, then the engine agent takes over the engine.
@app.task(name="worker.tasks.deploy", acks_late=True)
def deploy(deployment_id: int) -> str:
    return services.deployment_run(deployment_id=deployment_id)


@app.task(name="worker.tasks.stop", acks_late=True)
def stop(deployment_id: int) -> str:
    return services.deployment_stop(deployment_id=deployment_id)




# A benchmark sweep: its own queue, so it neither waits behind image builds nor delays a stop.
@app.task(name="worker.tasks.benchmark", acks_late=True)
def benchmark(run_id: int) -> str:
    from web.benchmarks import services as bench_services

    return bench_services.benchmark_run(run_id=run_id)


# A losslessness check: the bench queue too (it talks to engines as a benchmark does).
@app.task(name="worker.tasks.verification", acks_late=True)
def verification(run_id: int) -> str:
    from web.benchmarks import verification_services

    return verification_services.verification_run(run_id=run_id)


# A model root's read rate (issue 23): on the store's queue, beside the downloads, since
# it reads the same disk; sent with queue="models" (services/loadtime.py).
@app.task(name="worker.tasks.store_read_rate", acks_late=True)
def store_read_rate(root: str) -> str:
    from web.deployments.services import loadtime

    return f"{loadtime.root_read_rate_measure(root=root).gbps:.3f} GB/s"
