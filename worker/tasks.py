"""Thin tasks: a primary key in, one service call. Their names and queues are web/tasks.py's,
which sends every one of them."""

from __future__ import annotations

from web import tasks as names
from web.benchmarks import services as bench_services
from web.benchmarks import tune_applying, tune_task, verification_services
from web.builder.builds import deployment_run
from web.store import loadtime

from .celery import app


# A deploy builds (or finds) the image, then the engine agent takes over the engine.
@app.task(name=names.DEPLOYMENT_START, acks_late=True)
def deploy(deployment_id: int) -> str:
    return deployment_run(deployment_id=deployment_id)


# A benchmark sweep: its own queue, so it neither waits behind image builds nor delays a stop.
@app.task(name=names.BENCHMARK_RUN, acks_late=True)
def benchmark(run_id: int) -> str:
    return bench_services.benchmark_run(run_id=run_id)


# A losslessness check: the bench queue too (it talks to engines as a benchmark does).
@app.task(name=names.VERIFICATION_RUN, acks_late=True)
def verification(run_id: int) -> str:
    return verification_services.verification_run(run_id=run_id)


# A Tune: the bench queue (it benchmarks); it holds its deployment while it runs and
# restores it whatever ends it.
@app.task(name=names.TUNE_RUN, acks_late=True)
def tune(run_id: int) -> str:
    return tune_task.tune_run(run_id=run_id)


# Apply a Tune's winner: stop and start again on its spec, or a rolling redeploy.
@app.task(name=names.TUNE_APPLY, acks_late=True)
def tune_apply(run_id: int) -> str:
    return tune_applying.tune_apply_run(run_id=run_id)


# A model root's read rate: on the store's queue, beside the downloads, since it reads the
# same disk.
@app.task(name=names.ROOT_READ_RATE, acks_late=True)
def store_read_rate(root: str) -> str:
    return f"{loadtime.root_read_rate_measure(root=root).gbps:.3f} GB/s"
