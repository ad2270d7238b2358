"""The test engine's HTTP server: a thread per connection, quiet about clients gone.

SGLang serves with uvicorn, which prints nothing when a client resets or closes its
connection mid-answer (a health poll or a scrape given up by its timeout). The standard
library's server prints a traceback for it instead ("Exception occurred during processing
of request", then `ConnectionResetError`), which the appliance's log reader takes for the
engine's own error, as it would take one of SGLang's: those are never printed here.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any

GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], GONE):
            return
        super().handle_error(request, client_address)
