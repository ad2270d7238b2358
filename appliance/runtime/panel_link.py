"""A GPU host's link to the panel (web/fleet/hostapi.py): join once with a join token,
keep the host's credential in a file of its own, then report and ship events with it.

No Django: the remote agent talks to the panel over HTTPS only and holds no database or
broker address (docs/fleet.md, "The transport").
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from appliance import jsontext

Events = list[tuple[str, dict[str, Any]]]
SESSION_HEADER = "X-Agent-Session"  # this agent process's id: the panel's lease on the host
# One compact encoder for the other bodies (json.dumps with separators makes one per call).
_encode = json.JSONEncoder(separators=(",", ":")).encode


def event_json(kind: str, payload: dict[str, Any]) -> bytes:
    """One event as the ingest's body holds it, `[kind, payload]` in compact UTF-8 JSON
    (appliance.jsontext): its length is its size in the body."""
    return jsontext.dumps((kind, payload))


def events_body(encoded: list[bytes], **fields: Any) -> bytes:
    """The ingest's body: events already encoded one by one (event_json), then `fields`
    (row, start_token, after): each event's JSON is made once, for its size and the body."""
    rest = jsontext.dumps(fields)[1:] if fields else b"}"
    return b'{"events":[' + b",".join(encoded) + (b"]," if fields else b"]") + rest


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
    # This process's id to the panel, which lets one agent process write for a host at a
    # time (web/fleet/hostapi.py): the host's stored one (agent_session_hold) or a new one.
    agent_session: str = field(default_factory=lambda: secrets.token_hex(16))
    session_lock: int | None = None  # the stored id's lock (agent_session_hold), or None

    def close(self) -> None:
        """Let the next agent process of this host take the stored id (the lock goes)."""
        lock, self.session_lock = self.session_lock, None
        if lock is not None:
            os.close(lock)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}",
                SESSION_HEADER: self.agent_session, "Content-Type": "application/json"}

    def _post(self, path: str, body: dict[str, Any] | bytes,
              timeout_s: float | None = None) -> dict[str, Any]:
        # Compact, and encoded once: a busy engine's batch comes as bytes (events_body).
        data = body if isinstance(body, bytes) else _encode(body).encode()
        response = self.session.post(f"{self.panel_url.rstrip('/')}{path}", data=data,
                                     timeout=timeout_s or self.timeout_s,
                                     headers=self._headers())
        return _answer(response)

    def me(self) -> dict[str, Any]:
        """This host as the panel sees it: draining, the heartbeat interval, placements.
        The read holds the host for this agent process (PanelRefused 409 while another
        process holds it)."""
        response = self.session.get(f"{self.panel_url.rstrip('/')}/api/fleet/host/",
                                    timeout=self.timeout_s, headers=self._headers())
        return _answer(response)

    def release(self) -> bool:
        """This agent process stops: the panel's hold on the host for it ends now (waited
        for briefly: a stop must not wait on a panel that is away)."""
        return bool(self._post("/api/fleet/host/release/", {}, timeout_s=3.0).get("released"))

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
        body = events_body([event_json(kind, payload) for kind, payload in events],
                           row=row or {})
        return int(self.ship_body(deployment_id, body)["last_seq"])

    def ship_body(self, deployment_id: int, body: bytes) -> dict[str, Any]:
        """Store a batch encoded already (events_body): the panel's answer, {last_seq,
        stored} (stored false, with the row's log_cursor, when `after` was not the row's).
        PanelRefused 404 (not placed here), 409 (another start, another agent process)."""
        return self._post(f"/api/fleet/host/deployments/{deployment_id}/events/", body)

    def quiet(self, deployment_id: int) -> None:
        """A placed deployment's batches have stopped for now (the panel stores its status
        reads' answers)."""
        self._post(f"/api/fleet/host/deployments/{deployment_id}/quiet/", {})


def credential_store(path: Path, credential: str) -> None:
    """Write the credential readable by its owner only (made 0600 before a byte is in it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(credential + "\n")
    os.chmod(path, 0o600)


SESSION_ID = re.compile(r"[0-9a-f]{32}")


def agent_session_hold(credential_path: Path) -> tuple[str, int | None]:
    """This agent process's id to the panel, and the lock that holds it (None: not stored).

    The host's id is stored beside its credential, and a process holds it by an exclusive
    lock on that file, which the kernel drops when the process ends however it ends (a
    SIGKILL, an OOM kill). So an agent restarted on the same state takes its engines back
    at once, its lease being its own, while a second live process of the host (the lock
    held) gets a new id and waits for the other's lease, as before. Where the file cannot
    be had, a new id, not stored."""
    fresh = secrets.token_hex(16)
    path = credential_path.with_name(credential_path.name + ".session")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return fresh, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        stored = os.read(fd, 64).decode(errors="replace").strip()
        if SESSION_ID.fullmatch(stored):
            return stored, fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, fresh.encode(), 0)
        return fresh, fd
    except OSError:  # held by a live process of this host, or not writable
        os.close(fd)
        return fresh, None


def panel_link_open(*, panel_url: str, credential_path: Path, token: str, name: str,
                    report: dict[str, Any], timeout_s: float = 10.0) -> PanelLink:
    """The link with the stored credential while the panel takes it (a heartbeat proves
    it); else join with the token and store the new credential. PanelRefused when neither
    works (the host removed and its tokens revoked, a token expired): its message says why.
    Its agent session is the host's stored one where no other process holds it."""
    session, lock = agent_session_hold(credential_path)
    try:
        return _link_open(panel_url=panel_url, credential_path=credential_path, token=token,
                          name=name, report=report, timeout_s=timeout_s,
                          agent_session=session, session_lock=lock)
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise


def _link_open(*, panel_url: str, credential_path: Path, token: str, name: str,
               report: dict[str, Any], timeout_s: float, agent_session: str,
               session_lock: int | None) -> PanelLink:
    def link(credential: str) -> PanelLink:
        return PanelLink(panel_url, credential, timeout_s, agent_session=agent_session,
                         session_lock=session_lock)

    if credential_path.exists():
        stored = credential_path.read_text().strip()
        made = link(stored)
        try:
            made.heartbeat(report)
            return made
        except PanelRefused as exc:
            if exc.status != 401 or not token:
                raise
    if not token:
        raise PanelRefused(401, "this host has no credential yet: set APPLIANCE_JOIN_TOKEN "
                           "(or APPLIANCE_JOIN_TOKEN_FILE, a file holding it) to a join token "
                           "an admin made for it on the panel")
    joined = panel_join(panel_url=panel_url, token=token, name=name, report=report,
                        timeout_s=timeout_s)
    credential_store(credential_path, joined["credential"])
    return link(joined["credential"])
