"""The live channel: one Redis stream per deployment.

The database is the record; the stream only carries new events to open SSE
connections. Entry ids are `0-<seq>`, so a reader resumes from a sequence
number directly, and a gap (a trimmed stream, or an entry that lost a race)
is filled from the database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings

log = logging.getLogger(__name__)

STREAM_MAXLEN = 5000


def stream_key(deployment_id: int) -> str:
    return f"appliance:deployment:{deployment_id}:events"


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def publish(deployment_id: int, wire_events: Iterable[dict[str, Any]]) -> None:
    """Best effort: a failed publish loses nothing, readers fill gaps from the database."""
    try:
        pipe = _client().pipeline(transaction=False)
        for event in wire_events:
            pipe.xadd(
                stream_key(deployment_id),
                {"data": json.dumps(event)},
                id=f"0-{event['seq']}",
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        log.warning("live publish for deployment %s failed: %s", deployment_id, exc)


def seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])
