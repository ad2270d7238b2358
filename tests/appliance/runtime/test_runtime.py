"""EngineRuntime against the real Docker engine and the test engine image."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import docker.errors
import pytest
from docker.client import DockerClient

from appliance.runtime.client import EngineClient
from appliance.runtime.container_plan import (
    LABEL_DEPLOYMENT,
    LABEL_MANAGED,
    ContainerPlan,
    container_name,
    docker_run_kwargs,
)
from appliance.runtime.containers import (
    EngineRuntime,
    ImageMissingError,
    LogLine,
    network_is_closed,
)
from tests.conftest_docker import (  # noqa: F401 (fixtures)
    FAST_ENV,
    TEST_LABEL,
    ddtree_argv,
    docker_client,
    health_code,
    test_engine_image,
    unique_id,
    wait_for,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def runtime(docker_client: DockerClient) -> EngineRuntime:  # noqa: F811
    return EngineRuntime(docker_client)


@pytest.fixture
def deployment_id(runtime: EngineRuntime) -> Iterator[str]:
    """A fresh deployment id whose containers are removed after the test."""
    ident = unique_id("rt")
    yield ident
    for container in runtime.client.containers.list(ignore_removed=True,
            all=True, filters={"label": f"{LABEL_DEPLOYMENT}={ident}"}):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def plan_for(ident: str, image: str, **overrides: object) -> ContainerPlan:
    fields: dict = {"deployment_id": ident, "image": image, "argv": ddtree_argv(),
                    "env": dict(FAST_ENV), "labels": {TEST_LABEL: "1"}}
    fields.update(overrides)
    return ContainerPlan(**fields)


def collect_until(lines: Iterator[LogLine], needle: str, timeout_s: float = 30) -> list[LogLine]:
    """Read followed lines (in a thread, with a deadline) until one contains needle."""
    seen: list[LogLine] = []
    done = threading.Event()

    def read() -> None:
        for line in lines:
            seen.append(line)
            if needle in line.text:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(timeout_s), f"{needle!r} not seen; last lines: {seen[-5:]}"
    return seen


def test_the_container_name_is_deterministic_and_docker_safe() -> None:
    assert container_name("42") == "appliance-engine-42"
    assert container_name("42") == EngineRuntime.container_name("42")
    assert container_name("a b/c") == "appliance-engine-a-b-c"


def test_named_gpus_become_a_device_request_and_the_host_ipc_is_never_shared() -> None:
    kwargs = docker_run_kwargs(ContainerPlan("7", "img", ["x"], gpus=[0, 3]))
    (request,) = kwargs["device_requests"]
    assert request["DeviceIDs"] == ["0", "3"]
    assert request["Capabilities"] == [["gpu"]]
    assert "ipc_mode" not in kwargs and kwargs["shm_size"] == "32g"
    assert kwargs["ports"] == {"30000/tcp": ("127.0.0.1", None)}
    assert kwargs["pids_limit"] == 8192 and "mem_limit" not in kwargs
    assert kwargs["security_opt"] == ["no-new-privileges:true"]
    sized = docker_run_kwargs(ContainerPlan("7", "img", ["x"], shm_size="64g", mem_limit="900g",
                                            pids_limit=None, network="engines"))
    assert sized["shm_size"] == "64g" and sized["mem_limit"] == "900g"
    assert "pids_limit" not in sized and "device_requests" not in sized
    # On the engine network nothing is published on the host.
    assert sized["network"] == "engines" and "ports" not in sized


def test_secret_values_are_not_in_the_plan_or_its_run_arguments() -> None:
    plan = ContainerPlan("7", "img", ["x"], env={"A": "1"}, secrets=["HF_TOKEN"],
                         secrets_dir="/nonexistent")
    assert docker_run_kwargs(plan)["environment"] == {"A": "1"}


def test_it_starts_a_labelled_container_published_on_loopback_only(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    plan = plan_for(deployment_id, test_engine_image,
                    volumes={"/tmp": {"bind": "/models", "mode": "ro"}})
    container = runtime.ensure_started(plan)
    container.reload()
    assert container.name == f"appliance-engine-{deployment_id}"
    assert container.labels[LABEL_DEPLOYMENT] == deployment_id
    assert container.labels[LABEL_MANAGED] == "1"
    host_config = container.attrs["HostConfig"]
    bindings = host_config["PortBindings"]["30000/tcp"]
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
    # Its own IPC namespace (never the host's /dev/shm) with a /dev/shm sized for NCCL.
    assert host_config["IpcMode"] in ("private", "shareable")
    assert host_config["ShmSize"] == 32 * 1024**3
    assert host_config["PidsLimit"] and host_config["PidsLimit"] > 0
    assert host_config["Init"] is True
    assert container.attrs["Mounts"][0]["RW"] is False
    assert container.attrs["Config"]["Cmd"] == plan.argv
    url = runtime.engine_url(container, plan)
    assert url.startswith("http://127.0.0.1:")
    wait_for(lambda: health_code(url) == 200, 30)


def test_it_adopts_a_running_container_instead_of_starting_another(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    plan = plan_for(deployment_id, test_engine_image)
    first = runtime.ensure_started(plan)
    # A restarted worker has a fresh runtime; it must find the same container.
    again = EngineRuntime(runtime.client).ensure_started(plan)
    assert again.id == first.id
    assert runtime.find(deployment_id).id == first.id  # type: ignore[union-attr]
    assert first.id in {c.id for c in runtime.list_managed()}
    same = runtime.client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"{LABEL_DEPLOYMENT}={deployment_id}"})
    assert len(same) == 1


def test_it_replaces_an_exited_leftover_with_a_new_container(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    failing = plan_for(deployment_id, test_engine_image, env={**FAST_ENV,
                                                              "TEST_ENGINE_FAIL": "load-exit"})
    old = runtime.ensure_started(failing)
    old.wait(timeout=30)
    assert runtime.state(old) == ("exited", 1)
    new = runtime.ensure_started(plan_for(deployment_id, test_engine_image))
    assert new.id != old.id
    assert runtime.state(new)[0] == "running"
    assert runtime.state(old) == ("missing", None)


def test_follow_logs_keeps_stderr_apart_and_carriage_returns_inside_lines(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    plan = plan_for(deployment_id, test_engine_image)
    container = runtime.ensure_started(plan)
    url = runtime.engine_url(container, plan)
    wait_for(lambda: health_code(url) == 200, 30)
    # stdout and stderr are copied separately, so wait for a late line of each.
    lines = collect_until(runtime.follow_logs(container), '"GET /health HTTP/1.1" 200')
    err = [line.text for line in lines if line.stream == "stderr"]
    out = [line.text for line in lines if line.stream == "stdout"]
    assert any("TP0] Load weight begin" in t for t in err)
    shard = next(t for t in err if "Multi-thread loading shards" in t)
    assert shard.startswith("\r") and shard.count("\r") == 9 and "\n" not in shard
    assert any('"GET /model_info HTTP/1.1" 200 OK' in t for t in out)
    assert not any("Load weight" in t for t in out)
    assert any("fired up and ready to roll" in t for t in err)
    assert not any(line.partial for line in lines)


def test_follow_logs_can_yield_progress_pieces_as_they_arrive(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    # Slow enough that the follower is attached before the shard bar starts.
    env = {"TEST_ENGINE_PACE_S": "0.3", "TEST_ENGINE_FAIL": "hang-load"}
    container = runtime.ensure_started(plan_for(deployment_id, test_engine_image, env=env))
    wait_for(lambda: runtime.state(container)[0] == "running", 10)
    # hang-load stops mid-bar: the shard line never ends, only partial pieces show progress.
    pieces = collect_until(runtime.follow_logs(container, partials=True), "4/8", 20)
    partial = [p.text for p in pieces if p.partial]
    assert any(p.startswith("\rMulti-thread loading shards:  50% Completed | 4/8")
               for p in partial)
    assert any("Load weight begin" in p.text and not p.partial for p in pieces)


def test_follow_logs_since_skips_earlier_lines(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    container = runtime.ensure_started(plan_for(deployment_id, test_engine_image))
    url = runtime.engine_url(container, plan_for(deployment_id, test_engine_image))
    wait_for(lambda: health_code(url) == 200, 30)
    since = time.time()
    time.sleep(1.1)  # Docker's log timestamps are compared at sub-second precision
    EngineClient(url).generate_one_token()
    lines = collect_until(runtime.follow_logs(container, since=since), "POST /generate")
    assert not any("Load weight begin" in line.text for line in lines)


def test_state_reports_the_exit_code_of_a_failed_engine(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    plan = plan_for(deployment_id, test_engine_image,
                    env={**FAST_ENV, "TEST_ENGINE_FAIL": "capture-oom"})
    container = runtime.ensure_started(plan)
    assert runtime.state(container)[0] in ("created", "running")
    container.wait(timeout=30)
    assert runtime.state(container) == ("exited", 1)


def test_stop_stops_and_removes_the_container(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    container = runtime.ensure_started(plan_for(deployment_id, test_engine_image))
    started = time.monotonic()
    assert runtime.stop(deployment_id, timeout_s=20) is True
    assert time.monotonic() - started < 10  # the engine honours SIGTERM
    assert runtime.find(deployment_id) is None
    assert runtime.state(container) == ("missing", None)
    assert runtime.stop(deployment_id) is False


def test_on_a_network_the_engine_is_reached_by_name_and_nothing_is_published(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str) -> None:  # noqa: F811
    network = runtime.client.networks.create(unique_id("net"), labels={TEST_LABEL: "1"})
    try:
        plan = plan_for(deployment_id, test_engine_image, network=network.name)
        container = runtime.ensure_started(plan)
        container.reload()
        assert runtime.engine_url(container, plan) == f"http://{container.name}:30000"
        assert not container.attrs["HostConfig"]["PortBindings"]
        assert network.name in container.attrs["NetworkSettings"]["Networks"]
    finally:
        runtime.stop(deployment_id, timeout_s=5)
        network.remove()


def _engine_answers(url: str) -> bool:
    """Whether the engine's own /server_info answers at url (something else may: this
    machine's outbound traffic passes a proxy that answers any address it cannot reach)."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=3) as response:
            return "max_total_num_tokens" in json.loads(response.read() or b"{}")
    except (OSError, ValueError):
        return False


def _probe_from_container(runtime: EngineRuntime, image: str, url: str,
                          network: str | None = None, tries: int = 1) -> int:
    """The exit code of a container that asks url/server_info (up to `tries` times, a
    second apart): 0 when the engine answered, 1 when it did not (see _engine_answers)."""
    probe = ("import sys, time, urllib.request as u\n"
             f"for _ in range({tries}):\n"
             "    try:\n"
             f"        body = u.urlopen({url + '/server_info'!r}, timeout=3).read()\n"
             "        sys.exit(0 if b'max_total_num_tokens' in body else 1)\n"
             "    except OSError: time.sleep(1)\n"
             "sys.exit(1)\n")
    container = runtime.client.containers.run(
        image, entrypoint=["python3", "-c", probe], detach=True, network=network,
        labels={TEST_LABEL: "1"})
    try:
        return int(container.wait(timeout=60)["StatusCode"])
    finally:
        container.remove(force=True)


@pytest.fixture
def engine_network(runtime: EngineRuntime) -> Iterator[str]:
    name = unique_id("enet")
    yield name
    with contextlib.suppress(docker.errors.NotFound):
        network = runtime.client.networks.get(name)
        for container in network.containers:  # an engine whose own teardown comes later
            network.disconnect(container, force=True)
        network.remove()


def test_an_engine_on_the_engine_network_is_reached_by_its_members_only(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str,  # noqa: F811
        engine_network: str) -> None:
    network = runtime.ensure_network(engine_network)
    assert network.attrs["Internal"] is True
    plan = plan_for(deployment_id, test_engine_image, network=engine_network)
    container = runtime.ensure_started(plan)
    by_name = runtime.engine_url(container, plan)
    assert _probe_from_container(runtime, test_engine_image, by_name, engine_network,
                                 tries=30) == 0
    container.reload()
    address = container.attrs["NetworkSettings"]["Networks"][engine_network]["IPAddress"]
    by_address = f"http://{address}:30000"
    # A member (the agent, web's gateway, the worker) reaches it; the host and a container
    # on another network do not, by name or by address.
    assert _probe_from_container(runtime, test_engine_image, by_address, engine_network) == 0
    assert not _engine_answers(by_address)
    assert _probe_from_container(runtime, test_engine_image, by_address) != 0
    assert _probe_from_container(runtime, test_engine_image, by_name) != 0


def test_an_open_engine_network_left_by_an_older_version_is_made_again_while_empty(
        runtime: EngineRuntime, engine_network: str) -> None:
    old = runtime.client.networks.create(engine_network, driver="bridge",
                                         labels={LABEL_MANAGED: "1"})
    assert not network_is_closed(old.attrs)
    network = runtime.ensure_network(engine_network)
    assert network.id != old.id and network_is_closed(network.attrs)
    assert runtime.ensure_network(engine_network).id == network.id  # closed: kept as it is


def test_two_engine_networks_of_one_name_made_at_once_become_one(
        runtime: EngineRuntime, engine_network: str) -> None:
    """The daemon's duplicate check is not atomic (the worker and the agent make the network
    as they start): a second network of the name, which makes the name ambiguous for every
    engine's start, is removed and the oldest kept, whoever asks."""
    first = runtime.ensure_network(engine_network)
    second = runtime.client.networks.create(engine_network, check_duplicate=False,
                                            labels={LABEL_MANAGED: "1"}, internal=True)
    assert len([n for n in runtime.client.networks.list(names=[engine_network])
                if n.name == engine_network]) == 2
    assert runtime.ensure_network(engine_network).id == first.id
    left = [n.id for n in runtime.client.networks.list(names=[engine_network])
            if n.name == engine_network]
    assert left == [first.id] and second.id not in left


def test_an_open_engine_network_with_engines_on_it_is_kept_with_a_warning(
        runtime: EngineRuntime, deployment_id: str, test_engine_image: str,  # noqa: F811
        engine_network: str, caplog: pytest.LogCaptureFixture) -> None:
    old = runtime.client.networks.create(engine_network, driver="bridge",
                                         labels={LABEL_MANAGED: "1"})
    runtime.ensure_started(plan_for(deployment_id, test_engine_image, network=engine_network))
    with caplog.at_level("WARNING"):
        network = runtime.ensure_network(engine_network)
    assert network.id == old.id and not network_is_closed(network.attrs)
    warning = next(r.getMessage() for r in caplog.records if "is open to the host" in r.getMessage())
    assert f"docker network rm {engine_network}" in warning
    assert "without an API key" in warning
    runtime.stop(deployment_id, timeout_s=5)


def test_a_missing_image_is_named_with_how_to_build_it(
        runtime: EngineRuntime, deployment_id: str) -> None:
    plan = ContainerPlan(deployment_id, "appliance-no-such-image:never", ["true"])
    with pytest.raises(ImageMissingError, match="appliance-no-such-image:never.*docker build"):
        runtime.ensure_started(plan)


def test_shell_metacharacters_reach_the_engine_verbatim_and_run_nowhere() -> None:
    """argv and env are lists and a mapping end to end (spec -> launch argv -> Docker's
    Cmd), so `$(...)`, `;` and backticks are data, never a shell command."""
    from appliance.engine.launch import launch_args
    from appliance.engine.spec import spec_from_dict
    from tests.specs import spec

    hostile = "x; touch /tmp/pwned `id` $(reboot) && echo"
    launch = launch_args(spec_from_dict(spec(engine__served_model_name=hostile,
                                             extra_args=["--schedule-policy", hostile])))
    assert launch.argv.count(hostile) == 2 and launch.argv[0] == "python3"
    kwargs = docker_run_kwargs(ContainerPlan(deployment_id="1", image="img", argv=launch.argv,
                                             env={"SGLANG_X": hostile}))
    assert kwargs["command"] == launch.argv and "entrypoint" not in kwargs
    assert kwargs["environment"]["SGLANG_X"] == hostile
