"""A fleet host's agent (appliance.runtime.remote_agent) against a live panel, with the test
engine on this machine's Docker: it joins, takes the engine placed on it, starts it with
an API key on its advertised address, reports ready, ships the engine's log (stored and
shown, the key masked), stops it; it cannot read or step another host's deployment; its
credential ended mid-run, it stops writing and says why."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.test import Client, override_settings

import docker
from appliance.images.lock import LOCK_LABEL, lock_digest
from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.alerts import Alert
from appliance.runtime.container_plan import Identity
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.host_image import image_lock_refusal
from appliance.runtime.host_sink import RemoteMonitorSink, RemoteSink
from appliance.runtime.panel_link import PanelRefused, panel_link_open
from appliance.runtime.remote_agent import RemoteAgent, host_report
from appliance.runtime.series import MetricPoint as Point
from tests.conftest_docker import docker_client, remove_engines, test_engine_image, wait_for  # noqa: F401
from tests.fleet.hosts import remote_agent_running
from tests.fleet.simhosts import gateway
from tests.site_recipes import engine_source_repo, write_recipe
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services as deployments
from web.deployments.models import Deployment, DeploymentStatus, Event, MetricPoint
from web.deployments.services.installation import instance_id
from web.fleet import selectors, services
from web.fleet.models import FleetHost
from web.gateway.selectors import gateway_target
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
HOST = "gpu-r"
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4"}
ROOT = str(Path(__file__).resolve().parents[2])


def _advertise(client: docker.DockerClient) -> str:
    """This machine's address on Docker's bridge: not loopback, as a host's LAN address."""
    return gateway(client.networks.get("bridge"))


@pytest.fixture
def fleet_host(live_server, tmp_path: Path, docker_client, test_engine_image: str  # noqa: F811
               ) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    config = RemoteSettings(
        panel_url=live_server.url, host_name=HOST, advertise_addr=_advertise(docker_client),
        join_token=services.jointoken_create(host_name=HOST).secret,
        credential_path=tmp_path / "host-credential", gpu_requests=False, gpu_check=False,
        extra_env=FAST, stop_timeout_s=5, ready_timeout_s=90, tick_s=0.2)
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False), \
            remote_agent_running(config) as (agent, thread):
        yield {"agent": agent, "thread": thread, "config": config}
    remove_engines(instance_id())


def _placed(host: str = HOST, **changes: Any) -> Deployment:
    """A deployment placed on `host` and handed to its agent by the build worker."""
    made = deploying.deployment_create(data=spec(**changes), confirm_warnings=True)
    services.placement_assign(deployment=made, host_name=host, reason="named in the test")
    tasks.deploy.apply(args=[made.pk]).get()
    return Deployment.objects.get(pk=made.pk)


def _status(pk: int, wanted: set[str], timeout_s: float = 90) -> str:
    wait_for(lambda: Deployment.objects.get(pk=pk).status in wanted, timeout_s=timeout_s,
             every_s=0.2)
    return str(Deployment.objects.get(pk=pk).status)


def test_a_remote_host_runs_its_placed_engine_from_start_to_stop(fleet_host, viewer) -> None:  # type: ignore[no-untyped-def]
    row = _placed()
    assert _status(row.pk, {S.READY, S.FAILED}) == S.READY
    row = Deployment.objects.get(pk=row.pk)
    # The key the gateway sends this engine (web/gateway/selectors.py), never in its repr.
    target = gateway_target(model=row.name)
    assert target is not None and target.ready and target.engine_url == row.engine_url
    key = target.engine_key
    assert key == selectors.engine_key(deployment_id=row.pk, start_token=row.start_token)
    assert key not in repr(target)
    # Published on the advertised address only, and answering only with this start's key.
    assert row.engine_url.startswith(f"http://{fleet_host['config'].advertise_addr}:")
    assert requests.get(f"{row.engine_url}/v1/models", timeout=5).status_code == 401
    assert requests.get(f"{row.engine_url}/v1/models", timeout=5,
                        headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert row.agent_id == f"agent@{HOST}"
    # The engine's log is stored through the ingest, with its server_args' key masked.
    texts = list(Event.objects.filter(deployment=row, kind="log")
                 .values_list("payload__text", flat=True))
    args_line = next(t for t in texts if "server_args=ServerArgs(" in t)
    assert "api_key='***'" in args_line
    assert not Event.objects.filter(deployment=row, payload__icontains=key).exists()
    assert not any(key in str(t) for t in texts)
    client = Client()
    client.force_login(viewer)
    shown = client.get(f"/api/deployments/{row.pk}/events/?limit=1000").json()["results"]
    assert any("server_args=ServerArgs(" in str(e["payload"].get("text")) for e in shown)
    assert Deployment.objects.get(pk=row.pk).progress.get("weights", {}).get("finished")
    # The host's engine monitor scrapes /metrics into the panel's series, as the panel's own
    # agent does for its engines: the replica's charts and the deployment's summed throughput.
    wait_for(lambda: MetricPoint.objects.filter(deployment=row).count() >= 2, timeout_s=20,
             every_s=0.2)
    latest = Deployment.objects.get(pk=row.pk).latest_metrics
    assert latest["t"] > time.time() - 20 and latest["kv_usage"] is not None, latest

    deployments.deployment_mark_stopping(deployment_id=row.pk)
    assert _status(row.pk, {S.STOPPED}, 30) == S.STOPPED
    identity = Identity(str(row.pk), instance_id(), row.start_token)
    assert EngineRuntime().find(identity) is None


BASELINE = {"model_path": "/models/Kimi-K2.6", "tp_size": 1, "trust_remote_code": True,
            "speculative_algorithm": "NONE"}


def test_a_host_builds_its_engines_image_from_the_recipe_and_runs_it(  # type: ignore[no-untyped-def]
        fleet_host, tmp_path, docker_client) -> None:  # noqa: F811
    """No image crosses machines: the panel builds none for a joined host, whose agent
    builds the recipe on its own Docker (its build events stored as the panel's own), and
    the image carries the recipe's lock label, which the start then checks."""
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "site-host-engine", engine_source_repo(tmp_path))
    (recipes / "site-host.lock.txt").write_text("sglang==0.5.23 --hash=sha256:" + "1" * 64 + "\n")
    with (recipes / "site-host-engine.yaml").open("a") as recipe:
        recipe.write("lock: site-host.lock.txt\n")
    agent = fleet_host["agent"]
    agent.config = dataclasses.replace(agent.config, recipes_dir=str(recipes))
    built = ""
    try:
        with override_settings(ENGINE_IMAGE="", RECIPES_DIR=str(recipes)):
            row = _placed(name="host-built", recipe="site-host-engine", self_check=False,
                          engine=BASELINE)
            assert row.image == ""  # the panel built nothing
            assert _status(row.pk, {S.READY, S.FAILED}, 240) == S.READY, \
                Deployment.objects.get(pk=row.pk).diagnosis
        builds = [e.payload for e in Event.objects.filter(deployment_id=row.pk, kind="build")
                  .order_by("seq")]
        assert builds[0]["kind"] == "handed_over" and "on host gpu-r" in builds[0]["text"]
        kinds = [b["kind"] for b in builds]
        assert "build_step" in kinds and kinds[-1] == "built", kinds
        built = builds[-1]["text"].split()[1]
        assert built.startswith("appliance-engine:site-host-engine-")
        image = docker_client.images.get(built)
        wanted = lock_digest((recipes / "site-host.lock.txt").read_bytes())
        assert image.labels[LOCK_LABEL] == wanted
        running = EngineRuntime().find(Identity(str(row.pk), instance_id(),
                                                Deployment.objects.get(pk=row.pk).start_token))
        assert running is not None and running.image.id == image.id
        deployments.deployment_mark_stopping(deployment_id=row.pk)
        assert _status(row.pk, {S.STOPPED}, 30) == S.STOPPED
    finally:
        if built:
            # noprune: the untagged layers under it are other builds' cache, maybe in use
            docker_client.images.remove(built, force=True, noprune=True)


def test_a_host_whose_recipe_lock_differs_builds_nothing_and_says_so(  # type: ignore[no-untyped-def]
        fleet_host, tmp_path) -> None:
    panel_recipes, host_recipes = tmp_path / "panel", tmp_path / "host"
    repo = engine_source_repo(tmp_path)
    write_recipe(panel_recipes, "site-drift", repo)  # the panel's: no lock
    write_recipe(host_recipes, "site-drift", repo)
    (host_recipes / "other.lock.txt").write_text("torch==2.11.0 --hash=sha256:" + "2" * 64)
    with (host_recipes / "site-drift.yaml").open("a") as recipe:
        recipe.write("lock: other.lock.txt\n")
    agent = fleet_host["agent"]
    agent.config = dataclasses.replace(agent.config, recipes_dir=str(host_recipes))
    with override_settings(ENGINE_IMAGE="", RECIPES_DIR=str(panel_recipes)):
        row = _placed(name="drifted", recipe="site-drift", self_check=False, engine=BASELINE)
        assert _status(row.pk, {S.READY, S.FAILED}, 60) == S.FAILED
    row = Deployment.objects.get(pk=row.pk)
    assert "has the lock sha256:" in row.diagnosis["summary"], row.diagnosis
    assert "the panel's none" in row.diagnosis["summary"]
    assert [e.payload["kind"] for e in Event.objects.filter(deployment=row, kind="build")] == [
        "handed_over"]  # nothing built


def test_a_host_reads_and_steps_only_its_own_engines(fleet_host) -> None:  # type: ignore[no-untyped-def]
    mine = _placed()
    services.host_join(token=services.jointoken_create(host_name="gpu-other").secret,
                       name="gpu-other", facts=services.host_facts_from(host_report(
                           EngineRuntime(), fleet_host["config"])))
    theirs = _placed(host="gpu-other", name="theirs", gpus=[1])
    unplaced = deploying.deployment_create(data=spec(name="unplaced", gpus=[2]),
                                           confirm_warnings=True)
    link = fleet_host["agent"].link
    answer = link.me()
    assert [p["id"] for p in answer["placements"]] == [mine.pk]
    assert answer["placements"][0]["spec"]["name"] == mine.name
    for other in (theirs, unplaced):
        for call in (lambda pk=other.pk: link.step(pk, "stopped", theirs.start_token),
                     lambda pk=other.pk: link.ship(pk, [("log", {"text": "forged"})])):
            with pytest.raises(PanelRefused) as refused:
                call()
            assert refused.value.status == 404
    with pytest.raises(PanelRefused) as stale:
        link.step(mine.pk, "ready", "not-this-start", engine_url="http://10.1.2.3:30000")
    assert stale.value.status == 409
    with pytest.raises(PanelRefused) as inward:  # no relaying into the panel's own machine
        link.step(mine.pk, "ready", mine.start_token, engine_url="http://127.0.0.1:5440")
    assert inward.value.status == 400 and "engine_url" in str(inward.value)
    assert Deployment.objects.get(pk=theirs.pk).status == S.STARTING
    assert not Event.objects.filter(payload__text="forged").exists()


def test_a_host_whose_credential_ends_mid_run_stops_writing_and_says_why(  # type: ignore[no-untyped-def]
        fleet_host, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="appliance.runtime.remote_agent")
    row = _placed()
    assert _status(row.pk, {S.READY, S.FAILED}) == S.READY
    row = Deployment.objects.get(pk=row.pk)
    # The host joins again elsewhere (a new token): the running agent's credential ends.
    services.host_join(token=services.jointoken_create(host_name=HOST).secret, name=HOST,
                       facts=services.host_facts_from(host_report(EngineRuntime(),
                                                                  fleet_host["config"])))
    fleet_host["thread"].join(timeout=20)
    assert not fleet_host["thread"].is_alive()
    assert fleet_host["agent"].refused is not None
    assert "refused this host's credential" in caplog.text
    stored = Event.objects.filter(deployment=row).count()
    identity = Identity(str(row.pk), instance_id(), row.start_token)
    engine = EngineRuntime().find(identity)
    assert engine is not None and engine.status == "running"  # engines keep running
    key = selectors.engine_key(deployment_id=row.pk, start_token=row.start_token)
    for _ in range(3):  # the engine logs on; nothing more reaches the panel
        requests.post(f"{row.engine_url}/generate", timeout=10, json={
            "text": "hi", "sampling_params": {"max_new_tokens": 2}},
            headers={"Authorization": f"Bearer {key}"})
    wait_for(lambda: b"POST /generate" in engine.logs(), timeout_s=10)
    assert Event.objects.filter(deployment=row).count() == stored


def test_the_hosts_monitor_keeps_what_the_panel_did_not_take_and_sends_it_with_the_next(  # type: ignore[no-untyped-def]
        live_server, tmp_path: Path, docker_client, test_engine_image: str) -> None:  # noqa: F811
    config = RemoteSettings(
        panel_url=live_server.url, host_name=HOST, advertise_addr=_advertise(docker_client),
        join_token=services.jointoken_create(host_name=HOST).secret,
        credential_path=tmp_path / "host-credential", gpu_requests=False, gpu_check=False)
    runtime = EngineRuntime()
    link = panel_link_open(panel_url=config.panel_url, credential_path=config.credential_path,
                           token=config.join_token, name=HOST,
                           report=host_report(runtime, config))
    agent = RemoteAgent(link=link, config=config, runtime=runtime)  # not run: no engine
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False):
        row = _placed()
    placement = link.me()["placements"][0]
    followed = RemoteSink(placement, agent, threading.Event(),
                          Identity(str(row.pk), instance_id(), row.start_token))
    monitor = RemoteMonitorSink(followed)
    now = time.time()
    raised = Alert(id="metrics-unreachable", state="firing", severity="critical",
                   summary="the engine's /metrics did not answer 3 times")
    link.panel_url = "http://127.0.0.1:9"  # the panel is away: nothing listens there
    monitor.store(Point(t=now - 4, throughput=100.0))
    monitor.alerts([raised])
    monitor.store(Point(t=now - 2, throughput=101.0))
    assert not MetricPoint.objects.filter(deployment_id=row.pk).exists()
    link.panel_url = live_server.url  # back: the next report carries the kept ones
    monitor.store(Point(t=now, throughput=102.0))
    stored = MetricPoint.objects.filter(deployment_id=row.pk).order_by("ts")
    assert [p.to_point().throughput for p in stored] == [100.0, 101.0, 102.0]
    assert list(Deployment.objects.get(pk=row.pk).alerts) == ["metrics-unreachable"]
    assert Event.objects.filter(deployment_id=row.pk, kind="alert").count() == 1
    assert (monitor.points, monitor.pending_alerts) == (type(monitor.points)(), [])
    # A report the panel refuses (another start's) is dropped, not sent again and again.
    stale = RemoteMonitorSink(RemoteSink({**placement, "start_token": "gone"}, agent,
                                         threading.Event(), Identity(str(row.pk))))
    with pytest.raises(PanelRefused) as refused:
        stale.alerts([dataclasses.replace(raised, state="resolved")])
    assert refused.value.status == 409 and not stale.pending_alerts
    assert list(Deployment.objects.get(pk=row.pk).alerts) == ["metrics-unreachable"]


def test_a_host_refuses_an_image_whose_recipe_lock_differs(test_engine_image) -> None:  # noqa: F811
    runtime = EngineRuntime()
    refusal = image_lock_refusal(runtime, test_engine_image, "sha256:" + "a" * 64)
    assert "another recipe lock (none)" in refusal and "sha256:aaaa" in refusal
    assert image_lock_refusal(runtime, test_engine_image, "") == ""  # no lock on either side
    assert image_lock_refusal(runtime, test_engine_image, None) == ""  # a configured image


def test_the_hosts_agent_process_joins_with_no_database_broker_or_django(live_server, tmp_path  # type: ignore[no-untyped-def]
                                                                        ) -> None:
    """`python3 -m worker.agent` as compose.host.yaml runs it: a settings module that does
    not exist would stop any Django import at once, and no database or Redis URL is set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("APPLIANCE_", "DJANGO_"))}
    env.update(APPLIANCE_PANEL_URL=live_server.url, APPLIANCE_HOST_NAME=HOST,
               APPLIANCE_HOST_ADVERTISE_ADDR="10.9.8.7",
               APPLIANCE_JOIN_TOKEN=services.jointoken_create(host_name=HOST).secret,
               APPLIANCE_HOST_CREDENTIAL_FILE=str(tmp_path / "credential"),
               APPLIANCE_GPU_COUNT="2", DJANGO_SETTINGS_MODULE="no.such.settings")
    agent = subprocess.Popen([sys.executable, "-m", "worker.agent"], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: FleetHost.objects.filter(name=HOST, heartbeat_at__isnull=False)
                 .exists() or agent.poll() is not None, timeout_s=30)
        assert agent.poll() is None, agent.stdout.read() if agent.stdout else ""
        assert [g["index"] for g in FleetHost.objects.get(name=HOST).gpus] == [0, 1]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    assert (tmp_path / "credential").read_text().startswith("sdh-")


def test_the_host_compose_file_has_the_agent_and_no_database_or_broker() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose not installed")
    path = str(Path(ROOT) / "docker" / "compose.host.yaml")
    env = {"PATH": os.environ["PATH"], "APPLIANCE_PANEL_URL": "https://panel.example:8000",
           "APPLIANCE_HOST_NAME": "gpu-2", "APPLIANCE_HOST_ADVERTISE_ADDR": "10.0.0.12"}
    config = subprocess.run([compose, "-f", path, "config"], env=env, capture_output=True,
                            text=True, check=True).stdout
    assert "services:\n  agent:" in config and "https://panel.example:8000" in config
    for absent in ("DATABASE", "REDIS", "postgres", "redis"):
        assert absent not in config
    del env["APPLIANCE_HOST_ADVERTISE_ADDR"]
    refused = subprocess.run([compose, "-f", path, "config"], env=env, capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "APPLIANCE_HOST_ADVERTISE_ADDR" in refused.stderr
