"""The error a deployment service raises for bad input, apart so every service can raise it
(validation, leases, the actions) without importing the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.preflight import Finding


@dataclass
class DeploymentInputError(Exception):
    """Bad input: field -> messages, plus the pre-flight findings that blocked it."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    needs_confirmation: bool = False
    host: str = ""  # the host (or hosts) pre-flight checked the spec against

    def __str__(self) -> str:
        return "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())
