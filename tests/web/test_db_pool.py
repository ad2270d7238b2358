"""The panel's database connection pool under a real ASGI server (uvicorn)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.servers import panel_server
from tests.specs import spec
from web.deploy import services as deploying

pytestmark = pytest.mark.django_db(transaction=True)



def _app_name(tmp_path: Path) -> str:
    # Sessions are counted server-wide: each test's panel has a name of its own, or a
    # test on another worker adds its sessions to the count.
    return f"pool-test-{tmp_path.name}"[:63]


def _panel_sessions(app_name: str, terminate: bool = False) -> int:
    what = "pg_terminate_backend(pid)" if terminate else "1"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {what} FROM pg_stat_activity WHERE application_name = %s",
                       [app_name])
        return len(cursor.fetchall())


def test_many_concurrent_api_requests_share_a_bounded_pool(tmp_path: Path, operator, token_for):  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    headers = {"Authorization": f"Token {token_for(operator)}"}
    env = {"APPLIANCE_DB_POOL_MAX_SIZE": "3", "PGAPPNAME": _app_name(tmp_path)}
    with panel_server(tmp_path / "uvicorn.log", **env) as url:
        def get(i: int) -> int:
            path = f"/api/deployments/{pk}/" if i % 2 else f"/api/deployments/{pk}/summary/"
            return requests.get(f"{url}{path}", headers=headers, timeout=30).status_code

        with ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(get, range(200)))
        assert statuses == [200] * 200
        assert 1 <= _panel_sessions(env["PGAPPNAME"]) <= 3


def test_pooled_connections_broken_by_a_database_restart_fail_no_request(tmp_path: Path, operator, token_for):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    headers = {"Authorization": f"Token {token_for(operator)}"}
    env = {"APPLIANCE_DB_POOL_MAX_SIZE": "4", "PGAPPNAME": _app_name(tmp_path)}
    with panel_server(tmp_path / "uvicorn.log", **env) as url:
        summary = f"{url}/api/deployments/{pk}/summary/"
        assert requests.get(summary, headers=headers, timeout=10).status_code == 200
        assert _panel_sessions(env["PGAPPNAME"], terminate=True) >= 1  # what a restart does to idle sessions
        statuses = [requests.get(summary, headers=headers, timeout=10).status_code
                    for _ in range(8)]
        assert statuses == [200] * 8
