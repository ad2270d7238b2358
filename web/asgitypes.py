"""The ASGI types the panel's own ASGI layers share (the gateway, the status reads before
Django, the serving bridge): plain aliases, as the ASGI spec describes the callables."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
