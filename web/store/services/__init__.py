"""The model store's writes: downloads (request, job, cancel, resume) and the root scan."""

from .downloads import (
    JobOutcome,
    StoreInputError,
    hf_token,
    model_download_cancel,
    model_download_request,
    model_download_run,
    model_downloads_resume,
)
from .scan import model_store_scan

__all__ = [
    "JobOutcome",
    "StoreInputError",
    "hf_token",
    "model_download_cancel",
    "model_download_request",
    "model_download_run",
    "model_downloads_resume",
    "model_store_scan",
]
