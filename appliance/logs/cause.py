"""A failure cause of the catalogue and the diagnosis it gives: the types the catalogue
(appliance.logs.causes) and its DDTree part (appliance.logs.ddtree_causes) are made of.

A cause whose fix is a setting carries it as a spec patch ({"engine.cuda_graph_max_bs": 16}:
dotted spec keys to their new values), so the panel's Redeploy opens the form with the fix
applied; a fix that needs a person (a driver, a source, a file) has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.logs.context import ParseContext


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    summary: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    patch: Mapping[str, Any] | None = None
    # A finding while the engine runs: "info" (a note: what runs differs from what was
    # asked, by design) or "warning"; None for a failure's cause.
    severity: str | None = None

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "cause": self.cause,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": dict(self.evidence),
        }
        if self.patch:
            found["patch"] = dict(self.patch)
        if self.severity:
            found["severity"] = self.severity
        return found


Refiner = Callable[["Cause", str, "ParseContext | None"], "Diagnosis | None"]


@dataclass(frozen=True)
class Cause:
    id: str
    summary: str
    fix: str
    priority: int
    needles: tuple[str, ...] = ()
    refine: Refiner | None = None
    patch: Mapping[str, Any] | None = None  # the fix as spec keys, where it is one setting
    severity: str | None = None  # a run-time finding's (Diagnosis.severity)

    def diagnosis(self, **evidence: Any) -> Diagnosis:
        return Diagnosis(self.id, self.summary, self.fix, evidence, self.patch, self.severity)

    def worded(self, *, summary: str | None = None, fix: str | None = None,
               evidence: Mapping[str, Any] | None = None) -> Diagnosis:
        """This cause's diagnosis with a summary (or fix) that names the case: Docker's
        message, the model's state; the cause's own words where none is given."""
        return Diagnosis(self.id, summary or self.summary, fix or self.fix,
                         dict(evidence or {}), self.patch)

    def match(self, text: str, ctx: ParseContext | None) -> Diagnosis | None:
        needle = next((n for n in self.needles if n in text), None)
        if needle is None:
            return None
        if self.refine is None:
            return self.diagnosis(matched=needle)
        return self.refine(self, text, ctx)


def spec_patched(spec: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a spec mapping with a diagnosis' patch applied (dotted keys, one level of
    nesting: "engine.cuda_graph_max_bs", "shm_size")."""
    patched: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v
                               for k, v in spec.items()}
    for key, value in patch.items():
        top, _, inner = key.partition(".")
        if inner:
            section = patched.get(top)
            patched[top] = {**(section if isinstance(section, Mapping) else {}), inner: value}
        else:
            patched[top] = value
    return patched
