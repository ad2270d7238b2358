"""The failure catalogue: every cause a diagnosis may name, in one place.

Two parts, one id space: the engine's causes, found by needles in its log
(appliance.logs.causes, with the DDTree and recorded parts it gathers), and the causes the
appliance names itself (appliance.logs.appliance_causes: Docker's start errors, the image
build, the model store, the follower's watch). Both are linted by the same tests
(tests/appliance/logs/test_cause_fixes.py) and listed by `appliance causes`; whatever stores a
diagnosis checks it against this catalogue (catalogued), so the panel shows no cause id
that is not here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from appliance.logs.appliance_causes import APPLIANCE_CAUSES
from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.causes import CAUSES as ENGINE_CAUSES

__all__ = ["CATALOGUE", "UncataloguedCause", "catalogue_rows", "catalogued"]


class UncataloguedCause(ValueError):
    """A diagnosis names a cause id the catalogue does not have."""


def _one_id_space(parts: Iterable[tuple[str, Iterable[Cause]]]) -> dict[str, Cause]:
    found: dict[str, Cause] = {}
    where: dict[str, str] = {}
    for part, causes in parts:
        for cause in causes:
            if cause.id in found:
                raise ValueError(f"cause id {cause.id!r} is in both {where[cause.id]} "
                                        f"and {part}: one id, one cause")
            found[cause.id], where[cause.id] = cause, part
    return found


CATALOGUE: dict[str, Cause] = _one_id_space((
    ("engine", ENGINE_CAUSES.values()), ("appliance", APPLIANCE_CAUSES)))
_PART = {cause.id: "engine" for cause in ENGINE_CAUSES.values()} | {
    cause.id: "appliance" for cause in APPLIANCE_CAUSES}


def catalogued(diagnosis: Diagnosis) -> Diagnosis:
    """The diagnosis itself, once its cause is known to be in the catalogue."""
    if diagnosis.cause not in CATALOGUE:
        raise UncataloguedCause(
            f"diagnosis cause {diagnosis.cause!r} is not in the failure catalogue: add it to "
            "appliance/logs/appliance_causes.py (or causes.py for a cause the engine's log "
            "names) and make the diagnosis from it")
    return diagnosis


def catalogue_rows() -> list[dict[str, Any]]:
    """The catalogue as rows (`appliance causes`): id, part, priority, summary, fix, patch."""
    return [{"id": cause.id, "part": _PART[cause.id], "priority": cause.priority,
             "summary": cause.summary, "fix": cause.fix,
             "patch": dict(cause.patch) if cause.patch else None,
             "needles": list(cause.needles)}
            for cause in sorted(CATALOGUE.values(), key=lambda c: (_PART[c.id], c.id))]
