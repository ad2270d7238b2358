"""Pagination with a ceiling: ?limit= and ?offset= out of range are a 400 naming the bound."""

from __future__ import annotations

import re

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_LIMIT = 1000
# Far beyond any list here, far below PostgreSQL's bigint.
MAX_OFFSET = 10**9
_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")


def bounded_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """A query parameter as an integer in [low, high]; a 400 naming it otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not _INTEGER.fullmatch(raw.strip()):
        raise ValidationError({name: [f"must be an integer, got {raw[:40]!r}"]})
    value = int(raw)
    if not low <= value <= high:
        raise ValidationError({name: [f"must be between {low} and {high}"]})
    return value


class BoundedPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int:
        return bounded_int(request, self.limit_query_param, self.default_limit or 100, 1,
                           MAX_LIMIT)

    def get_offset(self, request: Request) -> int:
        return bounded_int(request, self.offset_query_param, 0, 0, MAX_OFFSET)
