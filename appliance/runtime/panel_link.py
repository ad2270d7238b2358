"""A GPU host's link to the panel (web/fleet/hostapi.py): join once with a join token,
keep the host's credential in a file of its own, then report and ship events with it.

No Django: the remote agent talks to the panel over HTTPS only and holds no database or
broker address (docs/fleet.md, "The transport").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

Events = list[tuple[str, dict[str, Any]]]


class PanelRefused(RuntimeError):
    """The panel answered with an error; `status` is its HTTP status, the message its
    explanation (what to fix)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the panel answered {status}: {detail}")
        self.status = status
        self.detail = detail


def _answer(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        detail = body.get("detail") if isinstance(body, dict) else None
        raise PanelRefused(response.status_code, str(detail or body or response.text[:300]))
    return body if isinstance(body, dict) else {}


def panel_join(*, panel_url: str, token: str, name: str, report: dict[str, Any],
               timeout_s: float = 10.0) -> dict[str, Any]:
    """Join with a join token: the panel's answer, with the host's credential in it."""
    response = requests.post(f"{panel_url.rstrip('/')}/api/fleet/join/", timeout=timeout_s,
                             json={"token": token, "name": name, **report})
    return _answer(response)


@dataclass
class PanelLink:
    """Calls the panel as one joined host (its credential)."""

    panel_url: str
    credential: str
    timeout_s: float = 10.0
    session: requests.Session = field(default_factory=requests.Session)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        # The body encoded here, once, compact: a busy engine's batch is hundreds of KiB.
        data = json.dumps(body, separators=(",", ":"))
        response = self.session.post(
            f"{self.panel_url.rstrip('/')}{path}", data=data, timeout=self.timeout_s,
            headers={"Authorization": f"Bearer {self.credential}",
                     "Content-Type": "application/json"})
        return _answer(response)

    def me(self) -> dict[str, Any]:
        """This host as the panel sees it: draining, the heartbeat interval, placements."""
        response = self.session.get(f"{self.panel_url.rstrip('/')}/api/fleet/host/",
                                    timeout=self.timeout_s,
                                    headers={"Authorization": f"Bearer {self.credential}"})
        return _answer(response)

    def heartbeat(self, report: dict[str, Any]) -> dict[str, Any]:
        return self._post("/api/fleet/host/heartbeat/", report)

    def step(self, deployment_id: int, step: str, start_token: str,
             **fields: Any) -> dict[str, Any]:
        """A status step for the current start of a placed engine (ready with engine_url,
        failed with diagnosis, message, last_lines): {moved, status}. PanelRefused 404 for
        a deployment not placed here, 409 for a start that is not the current one."""
        return self._post(f"/api/fleet/host/deployments/{deployment_id}/steps/",
                          {"step": step, "start_token": start_token, **fields})

    def metrics(self, deployment_id: int, start_token: str, *, points: list[dict[str, Any]],
                alerts: list[dict[str, Any]], compact: bool = False) -> int:
        """Store the engine monitor's points and alerts for the current start of a placed
        engine: how many points were stored. PanelRefused 404 (not placed here), 409
        (another start)."""
        body = {"start_token": start_token, "points": points, "alerts": alerts,
                "compact": compact}
        return int(self._post(f"/api/fleet/host/deployments/{deployment_id}/metrics/",
                              body)["stored"])

    def ship(self, deployment_id: int, events: Events,
             row: dict[str, Any] | None = None) -> int:
        """Store a batch of a placed deployment's events (and its row's fields): the last
        seq. PanelRefused 404 for a deployment not placed on this host."""
        body = {"events": [[kind, payload] for kind, payload in events], "row": row or {}}
        return int(self._post(f"/api/fleet/host/deployments/{deployment_id}/events/",
                              body)["last_seq"])


def credential_store(path: Path, credential: str) -> None:
    """Write the credential readable by its owner only (made 0600 before a byte is in it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(credential + "\n")
    os.chmod(path, 0o600)


def panel_link_open(*, panel_url: str, credential_path: Path, token: str, name: str,
                    report: dict[str, Any], timeout_s: float = 10.0) -> PanelLink:
    """The link with the stored credential while the panel takes it (a heartbeat proves
    it); else join with the token and store the new credential. PanelRefused when neither
    works (the host removed and its tokens revoked, a token expired): its message says why."""
    if credential_path.exists():
        stored = credential_path.read_text().strip()
        link = PanelLink(panel_url, stored, timeout_s)
        try:
            link.heartbeat(report)
            return link
        except PanelRefused as exc:
            if exc.status != 401 or not token:
                raise
    if not token:
        raise PanelRefused(401, "this host has no credential yet: set APPLIANCE_JOIN_TOKEN "
                           "to a join token an admin made for it on the panel")
    joined = panel_join(panel_url=panel_url, token=token, name=name, report=report,
                        timeout_s=timeout_s)
    credential_store(credential_path, joined["credential"])
    return PanelLink(panel_url, joined["credential"], timeout_s)
