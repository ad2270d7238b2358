"""The gateway's hot path without round trips (web/gateway/routing.py), against the real
Redis: the key epoch comes from a subscription while it is known good, and from Redis per
request whenever it is not; a limited key's requests come from leases of its minute, which
all processes together never overdraw."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import redis
from django.conf import settings
from django.db import connection

from web.gateway.routing import LEASE_SHARE, Routing
from web.gateway.services import KEYS_EPOCH, apikey_create, apikey_revoke, rate_limit_key
from web.gateway.watches import (
    EPOCH_WATCH_STALE_S,
    ROUTES_WATCH_NAME,
    ROUTES_WATCH_STALE_S,
    WATCH_NAME,
    EpochWatch,
    RoutesWatch,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def until(check, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)


async def settled(watch: RoutesWatch, still_s: float = 0.5) -> int:
    """The watch's count once it has not moved for `still_s`."""
    count = watch.current()[1]
    while True:
        await asyncio.sleep(still_s)
        if watch.current()[1] == count:
            return count
        count = watch.current()[1]


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def revoke(prefix: str) -> bool:
    """apikey_revoke off the test's thread, as the panel's views run it, the connection
    handed back after."""
    try:
        return apikey_revoke(prefix=prefix)
    finally:
        connection.close()


def kill_watch_connections() -> None:
    """As a Redis restart or a network cut would: this database's watch connections only."""
    client = redis_client()
    db = client.connection_pool.connection_kwargs.get("db", 0)
    for info in client.client_list():
        if info.get("name") == WATCH_NAME and int(info.get("db", -1)) == db:
            client.client_kill_filter(_id=info["id"])


def test_a_revocation_reaches_a_watching_process_without_a_read_per_request(operator) -> None:  # type: ignore[no-untyped-def]
    secret = apikey_create(owner_username=operator.username, name="watched").secret

    async def scenario() -> None:
        watch = EpochWatch()
        watch.start(settings.REDIS_URL)
        try:
            await until(lambda: watch.current()[0])
            before = watch.current()[1]
            assert before == redis_client().get(KEYS_EPOCH)
            assert await asyncio.to_thread(revoke, secret[:14])
            await until(lambda: watch.current()[1] != before, timeout_s=1.0)
            assert watch.current() == (True, redis_client().get(KEYS_EPOCH))
        finally:
            assert watch.task is not None
            watch.task.cancel()

    asyncio.run(scenario())


def test_a_killed_subscription_falls_back_to_reading_and_comes_back(operator) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        watch = EpochWatch()
        watch.start(settings.REDIS_URL)
        try:
            await until(lambda: watch.current()[0])
            kill_watch_connections()
            await until(lambda: not watch.current()[0], timeout_s=2.0)
            assert watch.current() == (False, None)  # the caller reads Redis itself now
            await until(lambda: watch.current()[0], timeout_s=5.0)
        finally:
            assert watch.task is not None
            watch.task.cancel()

    asyncio.run(scenario())


def test_a_silent_subscription_is_not_trusted_past_its_staleness(operator) -> None:  # type: ignore[no-untyped-def]
    watch = EpochWatch(epoch=b"7", good=True, seen_at=time.monotonic())
    assert watch.current() == (True, b"7")
    watch.seen_at -= EPOCH_WATCH_STALE_S + 0.1  # no answer to its pings for that long
    assert watch.current() == (False, None)


def test_the_request_path_reads_the_epoch_itself_until_the_watch_vouches(operator) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        routing = Routing(redis=client)
        # (its watch is not started: as in a process whose subscription is not made yet)
        await client.set(KEYS_EPOCH, b"41")
        assert await routing.epoch() == b"41"
        routing.watch.epoch, routing.watch.good = b"40", True
        routing.watch.seen_at = time.monotonic()
        assert await routing.epoch() == b"40"  # no read: the watch's
        await client.aclose()

    asyncio.run(scenario())


def one_window_ahead() -> None:
    """Waits out the end of the current minute when it is near: a window that ended mid-test
    would give the key a whole new minute's requests."""
    left = 60 - time.time() % 60
    if left < 8:
        time.sleep(left + 0.05)


def test_processes_leasing_one_keys_minute_never_pass_its_limit_together() -> None:
    async def scenario() -> tuple[int, int]:
        started = time.monotonic()
        clients = [redis.asyncio.Redis.from_url(settings.REDIS_URL) for _ in range(3)]
        processes = [Routing(redis=client) for client in clients]
        admitted = refused = 0
        for turn in range(1_200):  # the three take turns, as a balancer would spread them
            if await processes[turn % 3].take(key_id=9_001, limit=500):
                admitted += 1
            else:
                refused += 1
            await asyncio.sleep(0)  # let top-ups land as they would between requests
        for client in clients:
            await client.aclose()
        assert time.monotonic() - started < 7, "the run outlasted one_window_ahead's margin"
        return admitted, refused

    one_window_ahead()
    redis_client().delete(rate_limit_key(key_id=9_001)[0])
    admitted, refused = asyncio.run(scenario())
    share = 500 // LEASE_SHARE
    assert admitted <= 500
    assert admitted >= 500 - 2 * share * 3  # what leases left unused can cost, at most
    assert refused == 1_200 - admitted
    assert int(redis_client().get(rate_limit_key(key_id=9_001)[0]) or 0) <= 500


def test_a_limited_key_takes_a_round_trip_per_lease_not_per_request() -> None:
    async def scenario() -> int:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        routing = Routing(redis=client)
        for _ in range(250):
            assert await routing.take(key_id=9_002, limit=10_000)
            await asyncio.sleep(0)
        await client.aclose()
        return int(redis_client().get(rate_limit_key(key_id=9_002)[0]) or 0)

    one_window_ahead()
    redis_client().delete(rate_limit_key(key_id=9_002)[0])
    leased = asyncio.run(scenario())
    share = 10_000 // LEASE_SHARE
    assert leased % share == 0 and 250 <= leased <= 250 + 2 * share  # 3-4 leases for 250


def test_a_limit_of_two_is_two_requests_exactly() -> None:
    async def scenario() -> list[bool]:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        routing = Routing(redis=client)
        taken = [await routing.take(key_id=9_003, limit=2) for _ in range(3)]
        await client.aclose()
        return taken

    one_window_ahead()
    redis_client().delete(rate_limit_key(key_id=9_003)[0])
    assert asyncio.run(scenario()) == [True, True, False]


def test_the_routing_table_names_each_active_deployment_as_the_orm_reads_it() -> None:
    from web.deployments.models import Deployment, DeploymentStatus
    from web.gateway.selectors import gateway_targets

    def row(name: str, status: str, served: str | None) -> Deployment:
        engine = {"served_model_name": served} if served is not None else {}
        return Deployment.objects.create(name=name, spec={"name": name, "engine": engine},
                                         recipe="t", algorithm="NONE", gpus=[0],
                                         status=status, engine_url=f"http://{name}:30000")

    named = row("named", DeploymentStatus.READY, "Kimi-K2.6 \u00e9\"quoted\"")
    plain = row("plain", DeploymentStatus.LOADING, None)
    row("gone", DeploymentStatus.STOPPED, "gone-model")
    targets = {t.deployment_id: t for t in gateway_targets()}
    assert set(targets) == {named.id, plain.id}  # a stopped one is not routed to
    assert targets[named.id].model == "Kimi-K2.6 \u00e9\"quoted\""  # text, not JSON
    assert targets[plain.id].model == "plain" and not targets[plain.id].ready
    assert targets[named.id].ready and targets[named.id].engine_url == "http://named:30000"
    assert targets[named.id].created == int(named.created_at.timestamp())


def deployment_row(name: str, status: str, served: str | None = None):  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    engine = {"served_model_name": served} if served is not None else {}
    try:
        return Deployment.objects.create(name=name, spec={"name": name, "engine": engine},
                                         recipe="t", algorithm="NONE", gpus=[0],
                                         status=status, engine_url=f"http://{name}:30000")
    finally:
        connection.close()


def update_deployment(pk: int, **fields) -> None:  # type: ignore[no-untyped-def]
    """As the worker and the agent write: QuerySet.update, which sends no Django signal."""
    from web.deployments.models import Deployment

    try:
        Deployment.objects.filter(pk=pk).update(**fields)
    finally:
        connection.close()


def test_a_change_of_what_the_routing_table_holds_reaches_a_watching_process() -> None:
    from web.deployments.models import DeploymentStatus

    async def scenario() -> None:
        watch = RoutesWatch()
        watch.start()
        try:
            await until(lambda: watch.current()[0])
            other = await asyncio.to_thread(deployment_row, "replica-0", DeploymentStatus.READY)
            row = await asyncio.to_thread(deployment_row, "watched", DeploymentStatus.LOADING)
            await until(lambda: watch.current()[1] >= 2)  # the connect's count, the inserts
            for fields in ({"status": DeploymentStatus.READY},
                           {"engine_url": "http://elsewhere:30000"},
                           {"spec": {"name": "watched", "engine": {"served_model_name": "m"}}},
                           # what replicas added: a drained row, a replica's row, a companion,
                           # the mode, the agent whose heartbeat judges its host
                           {"draining": True},
                           {"replica_of_id": other.pk},
                           {"spec": {"name": "watched", "companion": "base",
                                     "engine": {"served_model_name": "m"}}},
                           {"algorithm": "DFLASH"},
                           {"agent_id": "agent-2"}):
                before = watch.current()[1]
                await asyncio.to_thread(update_deployment, row.pk, **fields)
                await until(lambda b=before: watch.current()[1] > b, timeout_s=2.0)
            # A column the table does not hold (the status summary's writers) tells nothing.
            # Counted once the count is still for 0.5 s: a notification of the changes above
            # may still be on its way on a loaded machine (CI, 2026-12-05: 11 against 10).
            before = await settled(watch)
            await asyncio.to_thread(update_deployment, row.pk, container_name="other")
            await asyncio.sleep(0.5)
            assert watch.current() == (True, before)
            # A placement made (the joined host whose heartbeat judges the row) tells.
            await asyncio.to_thread(place, row.pk)
            await until(lambda: watch.current()[1] > before, timeout_s=2.0)
        finally:
            assert watch.task is not None
            watch.task.cancel()

    asyncio.run(scenario())


def place(pk: int) -> None:
    from django.utils import timezone

    from web.fleet.models import FleetHost, Placement

    try:
        host = FleetHost.objects.create(name="gpu-9", credential_prefix="p9",
                                        credential_digest="9" * 64,
                                        credential_made_at=timezone.now())
        Placement.objects.create(deployment_id=pk, replica=0, host=host)
    finally:
        connection.close()


@contextlib.asynccontextmanager
async def watching_routing():  # type: ignore[no-untyped-def]
    """A Routing whose routes watch runs, as routing() makes it in a panel process."""
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    routing = Routing(redis=client)
    routing.routes_watch.start()
    try:
        yield routing
    finally:
        assert routing.routes_watch.task is not None
        routing.routes_watch.task.cancel()
        await client.aclose()


def test_a_request_after_a_change_is_routed_by_the_new_table_not_the_old() -> None:
    from web.deployments.models import DeploymentStatus

    async def scenario() -> None:
        async with watching_routing() as routing:
            row = await asyncio.to_thread(deployment_row, "turning", DeploymentStatus.LOADING)
            await until(lambda: routing.routes_watch.current()[0])
            [target] = await routing.targets(model="turning")
            assert not target.ready
            read_at = routing.table_at
            await asyncio.to_thread(update_deployment, row.pk, status=DeploymentStatus.READY)
            await until(lambda: routing.routes_watch.current()[1] != routing.table_changes)
            [target] = await routing.targets(model="turning")
            assert target.ready  # well within ROUTES_TTL_S: read because it changed
            assert routing.table_at > read_at
            # Nothing changed since: the table is not read again (no read per second).
            read_at = routing.table_at
            await asyncio.sleep(1.2)
            await routing.targets(model="turning")
            assert routing.table_at == read_at and routing.reading is None

    asyncio.run(scenario())


def kill_routes_watch_connections() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE application_name = %s AND datname = current_database()",
                           [ROUTES_WATCH_NAME])
    finally:
        connection.close()


def test_a_killed_listen_connection_falls_back_to_polling_and_comes_back() -> None:
    from web.deployments.models import DeploymentStatus

    async def scenario() -> None:
        async with watching_routing() as routing:
            await asyncio.to_thread(deployment_row, "polled", DeploymentStatus.READY)
            await until(lambda: routing.routes_watch.current()[0])
            await routing.targets(model="polled")
            await asyncio.to_thread(kill_routes_watch_connections)
            await until(lambda: not routing.routes_watch.current()[0], timeout_s=3.0)
            # Untrusted: a table over ROUTES_TTL_S old is read again in the background.
            read_at = routing.table_at
            await asyncio.sleep(1.1)
            await routing.targets(model="polled")
            await until(lambda: routing.table_at > read_at, timeout_s=2.0)
            await until(lambda: routing.routes_watch.current()[0], timeout_s=5.0)

    asyncio.run(scenario())


def test_a_silent_listen_connection_is_not_trusted_past_its_staleness() -> None:
    watch = RoutesWatch(changes=3, good=True, seen_at=time.monotonic())
    assert watch.current() == (True, 3)
    watch.seen_at -= ROUTES_WATCH_STALE_S + 0.1
    assert watch.current() == (False, 3)
