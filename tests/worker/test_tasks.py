"""Deploy and stop tasks and the engine agent against real Redis, PostgreSQL, Docker and the
test engine: the deploy task finds the image, the agent starts the engine and follows it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

import docker
from appliance.runtime.client import EngineClient
from appliance.runtime.container_plan import Identity
from appliance.runtime.containers import EngineRuntime
from tests.conftest_docker import engines_of, remove_engines
from tests.plans import own_host_plan
from tests.servers import bridge_address
from tests.specs import spec
from tests.waiting import wait_for_status
from tests.worker.conftest import own_agent
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.fleet.models import FleetHost
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus


@pytest.fixture
def engine(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    env = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "6"}
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=env, ENGINE_READY_TIMEOUT_S=90,
                           ENGINE_STOP_TIMEOUT_S=5, ENGINE_TEST_ENV=True):
        yield env
    remove_engines(instance_id())  # this database's engines only, never another run's


def _run(pk: int) -> str:
    """The deploy task, then the agent (running beside the test) until the engine settles."""
    tasks.deploy.apply(args=[pk]).get()
    return wait_for_status(pk, {S.READY, S.FAILED, S.STOPPED}, 90)


def _identity(deployment: Deployment) -> Identity:
    """The engine container's identity: this install, the deployment, its current start."""
    return Identity(str(deployment.pk), instance_id(), deployment.start_token)


def _container(deployment: Deployment):  # type: ignore[no-untyped-def]
    deployment.refresh_from_db()
    return docker.from_env().containers.get(_identity(deployment).name)


def _admin_client():  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("root", "", "root-pass-12345")
    client = Client()
    client.force_login(user)
    return client


def _deployment(**changes) -> Deployment:  # type: ignore[no-untyped-def]
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def _events(deployment: Deployment, kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [e.payload for e in deployment.events.filter(kind=kind).order_by("seq")]


def _failing(mode: str, **changes) -> Deployment:  # type: ignore[no-untyped-def]
    """A deployment whose test engine fails as `mode` says (its spec's env: the test
    engine's knobs, which the panel takes with APPLIANCE_ENGINE_TEST_ENV)."""
    return _deployment(env={"TEST_ENGINE_FAIL": mode}, **changes)


def test_deploy_goes_from_queued_to_ready_with_phases_and_progress_then_stops(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _deployment()
    assert _run(deployment.pk) == S.READY
    deployment.refresh_from_db()
    assert deployment.status == S.READY
    phases = [p["status"] for p in _events(deployment, "phase")]
    assert phases == ["starting", "checking", "loading", "capturing", "ready"]
    checks = _events(deployment, "selfcheck")
    begin = next(c for c in checks if c["kind"] == "selfcheck_begin")
    # The check runs at the widths this DDTree spec captures: budget+1 verify, block draft.
    assert {r["role"]: r["width"] for r in begin["roles"]} == {"target_verify": 33, "draft": 8}
    assert [c["kind"] for c in checks[-2:]] == ["selfcheck_report", "selfcheck_exit"]
    assert checks[-2]["ok"] is True and checks[-1]["rc"] == 0
    deployment.refresh_from_db()
    verdict = deployment.progress["self_check"]
    assert verdict["finished"] and verdict["ok"] and verdict["gpus"] == 1
    assert verdict["widths"] == {"target_verify": 33, "draft": 8}
    assert [c["id"] for c in checks if c["kind"] == "selfcheck_check"] == [
        "driver-version", "gpus-visible", "allreduce", "cuda-graph-target-verify",
        "cuda-graph-draft"]
    ordered = list(deployment.events.order_by("seq"))
    last_check = max(e.seq for e in ordered if e.kind == "selfcheck")
    first_load = min(e.seq for e in ordered if e.kind == "progress")
    assert last_check < first_load, "the self-check finishes before the weights load"
    progress = _events(deployment, "progress")
    shards = [p for p in progress if p["kind"] == "weights_progress"]
    assert any(p["done"] == p["total"] == 6 for p in shards), shards  # the target's 6 shards
    captures = [p for p in progress if p["kind"] == "capture_begin"]
    assert {c["role"] for c in captures} >= {"target", "draft"}
    assert any(p["kind"] == "capture_progress" for p in progress)
    # Progress bars redraw with "\r"; their pieces arrive before the line ends, so it is live.
    assert any(p.get("partial") and p["kind"] == "weights_progress" for p in progress)
    logs = _events(deployment, "log")
    assert any("fired up and ready to roll" in line["text"] for line in logs)
    assert {line["stream"] for line in logs} >= {"stderr"}
    assert deployment.progress["weights"]["finished"] is True
    container = _container(deployment)
    assert container.labels["appliance.deployment"] == str(deployment.pk)
    assert container.labels["appliance.start-token"] == deployment.start_token
    assert EngineClient(deployment.engine_url).health() == 200

    services.deployment_stop(deployment_id=deployment.pk)
    assert wait_for_status(deployment.pk, {S.STOPPED}, 30) == S.STOPPED  # the agent stops it
    deployment.refresh_from_db()
    assert deployment.status == S.STOPPED
    assert EngineRuntime().find(_identity(deployment)) is None
    assert deployment.events.order_by("-seq").first().kind == "end"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mode", "summary"),
    [
        ("selfcheck-driver", "driver-too-old: driver 575.57.08 is older than 580"),
        ("selfcheck-nccl", "allreduce: NCCL all-reduce failed"),
        ("selfcheck-crash", "exited with code 139 before printing its report"),
    ],
)
def test_a_failed_self_check_fails_the_deployment_before_the_model_loads(engine, agent, mode, summary):  # type: ignore[no-untyped-def]
    deployment = _failing(mode)
    assert _run(deployment.pk) == S.FAILED
    deployment.refresh_from_db()
    assert deployment.diagnosis["cause"] == "gpu-selfcheck-failed"
    assert summary in deployment.diagnosis["summary"]
    assert deployment.diagnosis["fix"]
    phases = _events(deployment, "phase")
    assert [p["status"] for p in phases] == ["starting", "checking", "failed"]
    assert "GPU self-check failed" in phases[-1]["message"]
    assert not _events(deployment, "progress"), "no weights were loaded"
    assert EngineRuntime().find(_identity(deployment)) is None


def test_a_spec_can_skip_the_self_check(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _deployment(self_check=False)
    assert _run(deployment.pk) == S.READY
    deployment.refresh_from_db()
    phases = [p["status"] for p in _events(deployment, "phase")]
    assert phases == ["starting", "loading", "capturing", "ready"]
    assert not _events(deployment, "selfcheck")


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("load-exit", None), ("capture-oom", "cuda-oom-capture"), ("ddtree-width", "ddtree-verify-width")],
)
def test_a_failing_engine_fails_the_deployment_with_a_diagnosis(engine, agent, mode, cause):  # type: ignore[no-untyped-def]
    deployment = _failing(mode)
    assert _run(deployment.pk) == S.FAILED
    deployment.refresh_from_db()
    assert deployment.status == S.FAILED
    assert deployment.diagnosis and deployment.diagnosis["cause"]
    if cause:
        assert deployment.diagnosis["cause"] == cause
    assert deployment.last_lines, "the last engine lines travel with the failure"
    assert EngineRuntime().find(_identity(deployment)) is None


def test_an_engine_that_exits_at_once_is_diagnosed_from_its_own_output(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _failing("model-missing", self_check=False)
    assert _run(deployment.pk) == S.FAILED
    deployment.refresh_from_db()
    assert deployment.diagnosis["cause"] == "model-not-found"
    assert "config.json" in deployment.diagnosis["fix"]
    phases = _events(deployment, "phase")
    assert "exited with code 1 before it was ready" in phases[-1]["message"]
    assert any("does not appear to have a file named config.json" in line
               for line in deployment.last_lines)
    assert EngineRuntime().find(_identity(deployment)) is None


def test_a_placements_read_from_before_a_failure_starts_no_engine_again(engine, agent):  # type: ignore[no-untyped-def]
    """A tick may act on a placements answer read before the panel took a failure step
    (still `starting`): the failed start's engine is not started again from it (a CI run
    found its container back after the failure). An agent of the same host that does not
    tick, so that nothing but the test acts."""
    import threading

    from appliance.logs.appliance_causes import start_failure
    from appliance.runtime.host_sink import RemoteSink
    from appliance.runtime.remote_agent import RemoteAgent

    deployment = _deployment()
    services.deployment_mark_starting(deployment_id=deployment.pk, image=str(
        settings.ENGINE_IMAGE), start_token="first-start")
    deployment.refresh_from_db()
    placement = {"id": deployment.pk, "status": "starting", "start_token": "first-start",
                 "spec": deployment.spec, "image": deployment.image,
                 "gpus": list(deployment.gpus), "log_cursor": "", "progress": {},
                 "engine_url": ""}
    still = RemoteAgent(link=agent.link, config=agent.config, runtime=EngineRuntime())
    RemoteSink(placement, still, threading.Event(), _identity(deployment)).failed(
        start_failure("the test's failure"), "the test's failure", [])
    assert wait_for_status(deployment.pk, {S.FAILED}, 10) == S.FAILED
    still._step(placement, instance_id())  # the stale answer: `starting`, the same start
    assert deployment.pk not in still.work
    time.sleep(1)
    assert EngineRuntime().find(_identity(deployment)) is None
    # A restart is a new start, with a new token: followed.
    assert still.failed_starts == {(deployment.pk, "first-start")}


def test_the_width_crash_names_block_size_and_budget_plus_one(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _failing("ddtree-width")
    _run(deployment.pk)
    deployment.refresh_from_db()
    text = f"{deployment.diagnosis['summary']} {deployment.diagnosis['fix']}"
    assert "8" in text and "33" in text


def test_a_stop_during_loading_stops_the_engine_and_its_container_within_seconds(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _failing("hang-load")
    tasks.deploy.apply(args=[deployment.pk]).get()
    assert wait_for_status(deployment.pk, {S.LOADING}, 30) == S.LOADING
    started = time.monotonic()
    services.deployment_stop(deployment_id=deployment.pk)
    assert wait_for_status(deployment.pk, {S.STOPPED, S.FAILED}, 30) == S.STOPPED
    assert time.monotonic() - started < 10
    assert EngineRuntime().find(_identity(deployment)) is None


def test_a_restarted_agent_adopts_the_running_container_instead_of_starting_another(engine, live_server, tmp_path):  # type: ignore[no-untyped-def]
    deployment = _deployment()
    pk = deployment.pk
    services.deployment_mark_starting(deployment_id=pk, image=str(settings.ENGINE_IMAGE),
                                      start_token="first-start")
    # The first agent started the container, as this host's agent plans it, and died
    # before it was ready.
    plan = own_host_plan(Deployment.objects.get(pk=pk), str(settings.ENGINE_IMAGE),
                         APPLIANCE_ENGINE_NETWORK="",
                         APPLIANCE_HOST_ADVERTISE_ADDR=bridge_address(),
                         APPLIANCE_ENGINE_GPU_REQUESTS="false",
                         APPLIANCE_ENGINE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in
                                                             engine.items()))
    first = EngineRuntime().ensure_started(plan)
    with own_agent(live_server.url, tmp_path):
        assert wait_for_status(pk, {S.READY, S.FAILED}, 60) == S.READY
    running = [c for c in engines_of(instance_id(), pk) if c.status == "running"]
    assert [c.id for c in running] == [first.id]


def test_a_container_with_our_labels_but_not_our_identity_is_never_adopted_or_stopped(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _deployment()
    pk = deployment.pk
    impostor = docker.from_env().containers.run(
        str(settings.ENGINE_IMAGE), ["sleep", "600"], entrypoint=[], detach=True,
        labels={"appliance.deployment": str(pk), "appliance.managed": "1"},
        name=f"impostor-{pk}")
    try:
        assert _run(pk) == S.READY
        mine = _container(Deployment.objects.get(pk=pk))
        assert mine.id != impostor.id
        impostor.reload()
        assert impostor.status == "running"
        # The agent reports it with its next heartbeat, and the panel shows it for what it
        # is. The panel tells the agent its interval on every tick: one a second here, so
        # the wait is not the default 10 s interval itself.
        with override_settings(FLEET_HEARTBEAT_S=1):
            deadline = time.monotonic() + 10
            while not any(c["name"] == impostor.name for h in FleetHost.objects.all()
                          for c in h.foreign_containers):
                assert time.monotonic() < deadline, "the stray container is reported"
                time.sleep(0.2)
        page = _admin_client().get("/").content.decode()
        assert impostor.name in page and "never adopted or stopped" in page
        services.deployment_stop(deployment_id=pk)
        assert wait_for_status(pk, {S.STOPPED}, 30) == S.STOPPED
        impostor.reload()
        assert impostor.status == "running", "another appliance's engine is never stopped"
    finally:
        impostor.remove(force=True)


def test_an_engine_left_running_by_a_reset_database_is_named_with_how_to_remove_it(engine, agent, caplog):  # type: ignore[no-untyped-def]
    """`docker compose down -v` deletes the database, so the next `up` is a new install (a new
    instance id): the old engines are no deployment's, never adopted, and said so."""
    orphan = docker.from_env().containers.run(
        str(settings.ENGINE_IMAGE), ["sleep", "600"], entrypoint=[], detach=True,
        labels={"appliance.deployment": "7", "appliance.managed": "1",
                "appliance.instance": "0123456789abcdef", "appliance.start-token": "old"},
        name=f"appliance-engine-01234567-7-old-{instance_id()[:6]}")
    try:
        with caplog.at_level("WARNING"):
            deadline = time.monotonic() + 15
            while not any(orphan.name in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the agent warns of the orphaned engine"
                time.sleep(0.2)
        warning = next(r.getMessage() for r in caplog.records if orphan.name in r.getMessage())
        assert "docker compose down -v" in warning and f"docker rm -f {orphan.name}" in warning
        page = _admin_client().get("/hosts/").content.decode()
        assert orphan.name in page and "docker compose down -v" in page
        assert "docker rm -f" in page
        orphan.reload()
        assert orphan.status == "running", "never stopped by this install"
    finally:
        orphan.remove(force=True)


def test_the_agent_ships_decode_stats_and_fails_an_engine_that_dies_while_serving(engine, agent):  # type: ignore[no-untyped-def]
    deployment = _deployment()
    assert _run(deployment.pk) == S.READY
    deployment.refresh_from_db()
    client = EngineClient(deployment.engine_url, timeout=30)
    for _ in range(3):
        list(client.chat_stream([{"role": "user", "content": "hi"}], max_tokens=32))
    deadline = time.monotonic() + 10
    while deployment.decode_stats.get("accept_len") is None and time.monotonic() < deadline:
        time.sleep(0.2)
        deployment.refresh_from_db()
    assert deployment.status == S.READY
    assert deployment.decode_stats.get("accept_len") is not None
    assert deployment.decode_stats.get("cuda_graph") is True

    _container(deployment).kill()
    assert wait_for_status(deployment.pk, {S.FAILED}, 20) == S.FAILED
    deployment.refresh_from_db()
    assert "signal 9" in deployment.diagnosis["summary"] or "killed" in str(deployment.diagnosis)


def test_gpus_on_a_host_whose_docker_has_no_nvidia_runtime_fail_before_anything_starts(engine, live_server, tmp_path):  # type: ignore[no-untyped-def]
    # This machine's Docker has no NVIDIA runtime (`docker info` lists runc only).
    deployment = _deployment()
    with override_settings(ENGINE_GPU_REQUESTS=True), \
            own_agent(live_server.url, tmp_path, gpu_requests=True):
        assert _run(deployment.pk) == S.FAILED
    deployment.refresh_from_db()
    assert deployment.diagnosis["cause"] == "no-gpu-runtime"
    assert "nvidia-ctk" in deployment.diagnosis["fix"]
    assert "no NVIDIA runtime" in deployment.diagnosis["summary"]
    assert not _engines_of(deployment), "nothing was started"


def test_once_the_agent_reported_the_host_pre_flight_refuses_gpus_it_cannot_give(engine, live_server, tmp_path):  # type: ignore[no-untyped-def]
    with own_agent(live_server.url, tmp_path):  # its engines given no GPUs (the simulator)
        deadline = time.monotonic() + 10
        while not FleetHost.objects.filter(heartbeat_at__isnull=False).exists():
            assert time.monotonic() < deadline, "the agent reports its host"
            time.sleep(0.2)
        host = FleetHost.objects.get()
        assert host.docker["nvidia"] is False and "runc" in host.docker["runtimes"]
        # No NVML here: the GPUs are a count, and the panel says so rather than showing zeros.
        assert host.gpu_telemetry["available"] is False
        assert [set(g) for g in host.gpu_telemetry["gpus"]] == [{"index"}] * settings.GPU_COUNT
        # The panel's own host, joined as any host is, its GPUs the count.
        assert host.is_joined and host.heartbeat_at is not None
        assert host.name == settings.HOST_NAME
        assert (host.gpu_source, len(host.gpus)) == ("count", settings.GPU_COUNT)
        page = _admin_client().get("/").content.decode()
        assert "a GPU count, no NVML" in page and "no NVIDIA runtime" in page
        assert _deployment(name="test-engine").status == S.QUEUED  # no GPU request: fine
    # The same host's agent restarted to give its engines GPUs (its
    # APPLIANCE_ENGINE_GPU_REQUESTS): what it reports is what pre-flight reads.
    with own_agent(live_server.url, tmp_path, gpu_requests=True):
        deadline = time.monotonic() + 10
        while not FleetHost.objects.get().docker.get("gpu_requests"):
            assert time.monotonic() < deadline, "the restarted agent reports its host"
            time.sleep(0.2)
        with pytest.raises(services.DeploymentInputError) as refused:
            _deployment(name="wants-gpus", gpus=[1])  # GPU 0 is test-engine's
    message = " ".join(refused.value.errors["gpus"])
    assert "this host's Docker has no NVIDIA runtime" in message and "nvidia-ctk" in message


def _engines_of(deployment: Deployment) -> list:  # type: ignore[type-arg]
    return engines_of(instance_id(), deployment.pk)
