"""A spec's field errors: where, what is wrong, and the fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class SpecError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))
