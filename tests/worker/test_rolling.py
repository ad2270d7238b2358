"""Rolling changes with the real engine agent, panel loop and Celery worker (processes, on
the test database and Redis) and the test engine in Docker: a rolling restart of 3 replicas
goes one at a time and survives its agent and its loop killed mid-roll (a new loop takes the
lock the killed one's session held and goes on from the rows); a rolling redeploy whose new
run fails halts at that replica, the others serving."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.conftest_docker import engines_of
from tests.servers import own_host_agent, panel_loop
from tests.specs import spec
from tests.waiting import wait_for_status
from tests.worker.stack import fast_engines, until, worker_agent_loop
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "2"}


@pytest.fixture
def env(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    with fast_engines(test_engine_image, FAST) as variables:
        yield variables


def _three_replicas() -> list[int]:
    """Three replicas through the create service (each row placed on the panel's host, on a
    GPU of its own, and queued for the worker), replica 0 first."""
    primary = deploying.deployment_create(data=spec(gpus=[0], replicas=3), confirm_warnings=True)
    rows = Deployment.objects.filter(pk=primary.pk) | primary.replica_rows.all()
    pks = list(rows.order_by("replica_index").values_list("pk", flat=True))
    assert len(pks) == 3 and len({tuple(r.gpus) for r in rows}) == 3
    return pks


class Watch:
    """Every (status, draining) of the replicas, read every 50 ms on a thread of its own."""

    def __init__(self, pks: list[int]) -> None:
        self.pks = pks
        self.seen: list[list[tuple[str, bool]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.wait(0.05):
                rows = dict(Deployment.objects.filter(pk__in=self.pks).values_list(
                    "pk", "status"))
                drained = set(Deployment.objects.filter(pk__in=self.pks, draining=True)
                              .values_list("pk", flat=True))
                self.seen.append([(rows[pk], pk in drained) for pk in self.pks])
        finally:
            connection.close()

    def end(self) -> list[list[tuple[str, bool]]]:
        self.stop.set()
        self.thread.join(timeout=5)
        return self.seen


def _rolling(pk: int) -> dict[str, Any]:
    return dict(Deployment.objects.get(pk=pk).rolling)


def _until(check: Any, what: Any, timeout_s: float = 120) -> Any:
    return until(check, what, timeout_s, poll_s=0.1)


def test_a_rolling_restart_survives_its_agent_and_loop_killed_and_a_failed_redeploy_halts(
        env: dict[str, str], tmp_path: Path) -> None:
    with worker_agent_loop(tmp_path, env, agent_log="agent1.log", loop_log="loop1.log") as (
            _, first_agent, first_loop, panel_url), contextlib.ExitStack() as successors:
        pks = _three_replicas()
        for pk in pks:
            assert wait_for_status(pk, {S.READY, S.FAILED}, 120) == S.READY
        tokens = {pk: Deployment.objects.get(pk=pk).start_token for pk in pks}

        watch = Watch(pks)
        services.deployment_restart(deployment_id=pks[0])
        # Replica 2's turn, its new run queued: the agent and the loop die (no goodbye:
        # SIGKILL), the loop holding its lock.
        _until(lambda: _rolling(pks[0])["at"] == 1 and _rolling(pks[0])["step"] == "starting",
               "the roll reaches replica 2's new run")
        for killed in (first_agent, first_loop):
            killed.kill()
            killed.wait()
        successors.enter_context(own_host_agent(tmp_path / "agent2.log", panel_url, tmp_path,
                                                **env))
        successors.enter_context(panel_loop(tmp_path / "loop2.log", **env))
        _until(lambda: _rolling(pks[0])["state"] != "rolling", lambda: (
            f"the new loop ends the roll: {_rolling(pks[0])}, replicas "
            f"{list(Deployment.objects.filter(pk__in=pks).values_list('pk', 'status', 'run'))}"
            f", the loop's log: {(tmp_path / 'loop2.log').read_text()[-3000:]}"
            f", the agent's log: {(tmp_path / 'agent2.log').read_text()[-3000:]}"),
            timeout_s=180)
        assert "panel loop: acting" in (tmp_path / "loop2.log").read_text()
        seen = watch.end()

        assert _rolling(pks[0])["state"] == "done", _rolling(pks[0])
        assert len(seen) > 50
        for state in seen:  # one replica out at a time; in the rotation only when ready
            assert sum(1 for status, draining in state
                       if draining or status != S.READY) <= 1, state
            assert all(status == S.READY for status, draining in state if not draining), state
        rows = [Deployment.objects.get(pk=pk) for pk in pks]
        assert all(r.status == S.READY and not r.draining and r.run == 2 for r in rows)
        for row in rows:  # each a new engine, the old one gone
            assert row.start_token != tokens[row.pk]
            running = [c for c in engines_of(instance_id(), row.pk) if c.status == "running"]
            assert [c.labels["appliance.start-token"] for c in running] == [row.start_token]

        # A redeploy whose new engine fails while loading: halted at replica 1, the others
        # serving their run 2 on the spec they had.
        broken = spec(gpus=[0], replicas=3, env={"TEST_ENGINE_FAIL": "load-exit"})
        deploying.deployment_redeploy(deployment_id=pks[0], data=broken, confirm_warnings=True)
        _until(lambda: _rolling(pks[0])["state"] != "rolling", "the redeploy halts")
        roll = _rolling(pks[0])
        assert (roll["state"], roll["at"]) == ("halted", 0), roll
        assert roll["text"].startswith("rolling redeploy halted at replica 1 of 3: its new "
                                       "run 3 did not become ready: "), roll["text"]
        first, *others = [Deployment.objects.get(pk=pk) for pk in pks]
        assert first.status == S.FAILED and first.diagnosis["summary"] in roll["text"]
        assert all(r.status == S.READY and not r.draining and r.run == 2 for r in others)
        assert all("TEST_ENGINE_FAIL" not in (r.spec.get("env") or {}) for r in others)
