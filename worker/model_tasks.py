"""The model store's jobs (queue models): one download per task, resumed after a restart."""

from __future__ import annotations

from typing import Any

from celery import Task

from web import tasks as names
from web.store import services

from .celery import app


# bind: the retry count and the task id (the entry's lease owner) come from the request.
@app.task(name=names.MODEL_DOWNLOAD, bind=True, acks_late=True,
          max_retries=None)
def model_download(self: Task, entry_id: int) -> str:  # type: ignore[type-arg]
    attempt = int(self.request.retries or 0)
    outcome = services.model_download_run(entry_id=entry_id, job_id=str(self.request.id),
                                          attempt=attempt)
    if outcome.retry_in is not None:
        # Busy (another job's lease has not run out) or the hub did not answer: again later.
        raise self.retry(countdown=outcome.retry_in)
    return outcome.state


@app.task(name=names.MODEL_DOWNLOADS_RESUME, acks_late=True)
def model_downloads_resume(*_: Any) -> list[int]:
    return services.model_downloads_resume()


@app.task(name=names.MODEL_STORE_SCAN, acks_late=True)
def model_store_scan() -> int:
    """The roots looked through (at worker start): folders copied by hand become entries."""
    return len(services.model_store_scan())
