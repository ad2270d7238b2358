"""Log filters for the panel's processes."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied


class DeniedWithoutTraceback(logging.Filter):
    """A refused request (403) is logged as its one line, without the stack that raised it.

    Django logs a PermissionDenied with its traceback; a person without the role is not a
    fault in the panel, and a traceback in the log reads as one.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True
