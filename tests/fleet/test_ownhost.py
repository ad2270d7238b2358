"""The panel's own host joins like any host: `manage.py ownhost` keeps a usable join token
for it in a file (0600, never printed or logged), made again when the file's is missing,
spent, revoked or expires within a day, kept otherwise; the agent reads that file
(APPLIANCE_JOIN_TOKEN_FILE), waiting for it bounded, and the token stays out of its
environment, its settings' repr and its log."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from tests.conftest_docker import wait_for
from web.fleet import services
from web.fleet.models import FleetHost, JoinToken

from .hosts import report

HOST = "panel-gpu"
ROOT = str(Path(__file__).resolve().parents[2])


def _ownhost(path: Path, caplog: pytest.LogCaptureFixture, *args: str) -> str:
    """The command's output and every log record it made, together."""
    out, err = io.StringIO(), io.StringIO()
    with caplog.at_level(logging.DEBUG):
        call_command("ownhost", "--out", str(path), *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue() + caplog.text


def _secret_free(text: str, path: Path) -> None:
    secret = path.read_text()
    assert secret.startswith("sdj-") and secret not in text, text
    assert not re.search(r"sdj-\w{8,}", text), text


@pytest.mark.django_db
def test_ownhost_writes_a_token_for_the_own_host_and_prints_only_path_and_expiry(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "own-host" / "token"
    with override_settings(HOST_NAME=HOST):
        printed = _ownhost(path, caplog)
    _secret_free(printed, path)
    token = JoinToken.objects.get(host_name=HOST)
    assert str(path) in printed and token.expires_at.strftime("%Y-%m-%d %H:%M") in printed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert services.secret_digest(path.read_text()) == token.digest
    assert token.expires_at - timezone.now() > timedelta(days=6)
    # It joins the own host (the agent's join), once.
    services.host_join(token=path.read_text(), name=HOST,
                       facts=services.host_facts_from(report()))
    assert FleetHost.objects.filter(name=HOST).exists()


@pytest.mark.django_db
def test_ownhost_keeps_a_usable_token_and_makes_a_new_one_for_a_spent_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "token"
    _ownhost(path, caplog, "--host", HOST)
    first = path.read_text()
    printed = _ownhost(path, caplog, "--host", HOST)
    assert path.read_text() == first and "kept" in printed
    assert JoinToken.objects.count() == 1
    services.host_join(token=first, name=HOST, facts=services.host_facts_from(report()))
    printed = _ownhost(path, caplog, "--host", HOST)
    _secret_free(printed, path)
    assert path.read_text() != first and "spent" in printed
    assert JoinToken.objects.count() == 2
    # The new one joins again: the host's credential is replaced (a re-join).
    services.host_join(token=path.read_text(), name=HOST,
                       facts=services.host_facts_from(report()))


@pytest.mark.django_db
def test_ownhost_replaces_a_revoked_or_expiring_token_and_revokes_the_expiring_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "token"
    _ownhost(path, caplog, "--host", HOST)
    revoked = JoinToken.objects.get()
    services.jointoken_revoke(token_id=revoked.pk)
    printed = _ownhost(path, caplog, "--host", HOST)
    assert "revoked" in printed
    expiring = JoinToken.objects.exclude(pk=revoked.pk).get()
    assert services.secret_digest(path.read_text()) == expiring.digest
    JoinToken.objects.filter(pk=expiring.pk).update(
        expires_at=timezone.now() + timedelta(hours=23))
    printed = _ownhost(path, caplog, "--host", HOST)
    _secret_free(printed, path)
    assert "expires within a day" in printed
    newest = JoinToken.objects.exclude(pk__in=[revoked.pk, expiring.pk]).get()
    assert services.secret_digest(path.read_text()) == newest.digest
    # No file holds the replaced one any more: it can join nothing.
    expiring.refresh_from_db()
    assert expiring.revoked_at is not None and newest.revoked_at is None
    # A token with more than a day left is kept.
    JoinToken.objects.filter(pk=newest.pk).update(
        expires_at=timezone.now() + timedelta(hours=25))
    assert "kept" in _ownhost(path, caplog, "--host", HOST)
    assert services.secret_digest(path.read_text()) == newest.digest


@pytest.mark.django_db
def test_ownhost_refuses_a_bad_name_or_a_life_of_a_day_naming_the_option(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(CommandError, match="host_name"):
        _ownhost(tmp_path / "token", caplog, "--host", "Not A Name")
    with pytest.raises(CommandError, match="ttl_hours"):
        _ownhost(tmp_path / "token", caplog, "--host", HOST, "--ttl-hours", "24")
    assert not (tmp_path / "token").exists() and not JoinToken.objects.exists()


AGENT_ENV = {"APPLIANCE_PANEL_URL": "http://web:8000", "APPLIANCE_HOST_NAME": HOST,
             "APPLIANCE_ENGINE_NETWORK": "appliance-engines"}


def test_the_agent_reads_its_token_from_the_file_and_keeps_it_out_of_env_and_repr(
        tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("sdj-0123abcdSecretPart\n")
    env = {**AGENT_ENV, "APPLIANCE_JOIN_TOKEN_FILE": str(path),
           "APPLIANCE_HOST_CREDENTIAL_FILE": str(tmp_path / "credential")}
    config = RemoteSettings.from_env(env)
    assert config.join_token == "sdj-0123abcdSecretPart"
    assert "SecretPart" not in repr(config)
    assert not any("SecretPart" in value for value in os.environ.values())
    assert "SecretPart" not in repr(env)


def test_the_agent_waits_for_its_token_file_bounded(tmp_path: Path) -> None:
    path = tmp_path / "own-host" / "token"
    env = {**AGENT_ENV, "APPLIANCE_JOIN_TOKEN_FILE": str(path),
           "APPLIANCE_HOST_CREDENTIAL_FILE": str(tmp_path / "credential"),
           "APPLIANCE_JOIN_TOKEN_WAIT_S": "30"}
    waiting = threading.Event()
    got: list[str] = []

    def read() -> None:
        waiting.set()
        got.append(RemoteSettings.from_env(env).join_token)

    reader = threading.Thread(target=read)
    reader.start()
    assert waiting.wait(5)
    path.parent.mkdir()
    path.write_text("sdj-later")  # as ownhost writes it: whole, then in place
    reader.join(timeout=10)
    assert not reader.is_alive() and got == ["sdj-later"]
    # None within the bound, and no stored credential: the agent says where it looked.
    with pytest.raises(SystemExit, match=r"no join token in .*none.* after 0 s"):
        RemoteSettings.from_env({**env, "APPLIANCE_JOIN_TOKEN_FILE": str(tmp_path / "none"),
                                 "APPLIANCE_JOIN_TOKEN_WAIT_S": "0"})


def test_with_a_stored_credential_the_agent_does_not_wait_for_a_token(tmp_path: Path) -> None:
    credential = tmp_path / "credential"
    credential.write_text("sdh-stored\n")
    env = {**AGENT_ENV, "APPLIANCE_JOIN_TOKEN_FILE": str(tmp_path / "none"),
           "APPLIANCE_HOST_CREDENTIAL_FILE": str(credential),
           "APPLIANCE_JOIN_TOKEN_WAIT_S": "600"}
    waited = threading.Event()
    thread = threading.Thread(target=lambda: (RemoteSettings.from_env(env), waited.set()))
    thread.start()
    assert waited.wait(5), "read at once: the stored credential is used first"
    thread.join(timeout=5)


def test_the_agent_process_joins_with_ownhosts_file_and_logs_no_secret(
        live_server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """`python3 -m worker.agent` given the file ownhost keeps: it joins as the own host; the
    token is in neither its environment (/proc/<pid>/environ) nor its output."""
    path = tmp_path / "own-host" / "token"
    _ownhost(path, caplog, "--host", HOST)
    secret = path.read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "DJANGO_"))}
    env.update(APPLIANCE_PANEL_URL=live_server.url, APPLIANCE_HOST_NAME=HOST,
               APPLIANCE_HOST_ADVERTISE_ADDR="10.9.8.7", APPLIANCE_JOIN_TOKEN_FILE=str(path),
               APPLIANCE_HOST_CREDENTIAL_FILE=str(tmp_path / "credential"),
               APPLIANCE_GPU_COUNT="1", APPLIANCE_LOG_LEVEL="DEBUG",
               DJANGO_SETTINGS_MODULE="no.such.settings")
    agent = subprocess.Popen([sys.executable, "-m", "worker.agent"], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: FleetHost.objects.filter(name=HOST, heartbeat_at__isnull=False)
                 .exists() or agent.poll() is not None, timeout_s=30)
        assert agent.poll() is None
        assert secret.encode() not in Path(f"/proc/{agent.pid}/environ").read_bytes()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
    output = agent.stdout.read() if agent.stdout else ""
    assert "fleet agent for host" in output, output  # the log is there, and holds no token
    assert secret not in output and not re.search(r"sdj-\w{8,}", output), output
    assert JoinToken.objects.get(host_name=HOST).uses == 1
