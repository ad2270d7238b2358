"""A failure cause of the catalogue and the diagnosis it gives: the types the catalogue
(appliance.logs.causes) and its DDTree part (appliance.logs.ddtree_causes) are made of."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.logs.context import ParseContext


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    summary: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": dict(self.evidence),
        }


Refiner = Callable[["Cause", str, "ParseContext | None"], "Diagnosis | None"]


@dataclass(frozen=True)
class Cause:
    id: str
    summary: str
    fix: str
    priority: int
    needles: tuple[str, ...] = ()
    refine: Refiner | None = None

    def diagnosis(self, **evidence: Any) -> Diagnosis:
        return Diagnosis(self.id, self.summary, self.fix, evidence)

    def match(self, text: str, ctx: ParseContext | None) -> Diagnosis | None:
        needle = next((n for n in self.needles if n in text), None)
        if needle is None:
            return None
        if self.refine is None:
            return self.diagnosis(matched=needle)
        return self.refine(self, text, ctx)
