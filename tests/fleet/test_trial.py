"""The GPU-less trial's made-for-you parts: the simulator's model folders, a join token per
host written to its own file (never printed), and the simulator's label on every page and
result once a host reports its image."""

from __future__ import annotations

import io
import json
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from appliance.simulator import SIMULATOR_LABEL, simulator_models_write, simulator_tags
from appliance.store.scan import safetensors_problem
from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401
from tests.hostrows import host_reported
from tests.rows import ready
from web.benchmarks import services as bench
from web.deployments.services.hosts import host_gpu_inventory_findings
from web.deployments.simulator import SIMULATOR_NOTE
from web.fleet import services
from web.fleet.hostfacts import host_facts
from web.fleet.models import FleetHost, JoinToken

from .hosts import joined, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_simulator_model_folders_hold_a_config_and_whole_safetensors(tmp_path: Path) -> None:
    folders = simulator_models_write(root=tmp_path)
    assert [f.name for f in folders] == ["test", "test-dflash"]
    for folder in folders:
        weights = folder / "model.safetensors"
        assert safetensors_problem(weights, weights.stat().st_size) is None
        assert json.loads((folder / "config.json").read_text())["architectures"]
    (tmp_path / "test" / "config.json").write_text('{"kept": true}')
    simulator_models_write(root=tmp_path)
    assert json.loads((tmp_path / "test" / "config.json").read_text()) == {"kept": True}, \
        "a folder already there is left as it is"


@pytest.mark.django_db
def test_jointokens_writes_each_hosts_token_to_its_own_file_and_prints_none(tmp_path: Path) -> None:
    out = io.StringIO()
    call_command("jointokens", "sim-a", "sim-b", "--out", str(tmp_path), stdout=out)
    printed = out.getvalue()
    for name in ("sim-a", "sim-b"):
        path = tmp_path / name / "token"
        secret = path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert secret not in printed and str(path) in printed
        assert services.secret_digest(secret) == JoinToken.objects.get(host_name=name).digest
    assert not re.search(r"sdj-\w{8,}", printed), printed
    # The token joins the host it was made for.
    secret = (tmp_path / "sim-a" / "token").read_text()
    services.host_join(token=secret, name="sim-a", facts=services.host_facts_from(report()))
    assert FleetHost.objects.filter(name="sim-a").exists()


@pytest.mark.django_db
def test_jointokens_makes_none_for_a_host_that_has_joined(tmp_path: Path) -> None:
    joined("sim-a")
    out = io.StringIO()
    call_command("jointokens", "sim-a", "--out", str(tmp_path), stdout=out)
    assert "sim-a has joined already" in out.getvalue()
    assert not (tmp_path / "sim-a").exists() and JoinToken.objects.count() == 1


def _reports(images: list[str]) -> None:
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"server_version": "20.10.24", "simulator_images": images})


@pytest.mark.django_db
def test_every_page_and_benchmark_says_simulator_once_a_host_reports_its_image(
        operator) -> None:  # type: ignore[no-untyped-def]
    sim = ready(name="sim-ddt", gpus=[0])
    sim.image, sim.engine_url = "appliance-test-engine:latest", "http://sim-a:30001"
    sim.save(update_fields=["image", "engine_url"])
    client = Client()
    client.force_login(operator)
    assert SIMULATOR_NOTE not in client.get("/").content.decode(), "no host said so yet"
    assert bench.target_name(sim) == f"sim-ddt#{sim.pk}"

    _reports(["appliance-test-engine:latest"])
    for path in ("/", f"/deployments/{sim.pk}/", "/fleet/", "/benchmarks/"):
        assert 'id="simulator-banner"' in client.get(path).content.decode(), path
    assert bench.target_name(sim) == f"sim-ddt#{sim.pk} (simulator)"
    run = bench.benchmark_create(deployment_ids=[sim.pk], config={
        "levels": [1], "num_prompts": 2, "input_len": 8, "output_len": 8,
        "prompt_source": "synthetic", "mode": "back_to_back", "warmup": 0, "seed": 0,
        "request_rate": None})
    assert run.targets[0]["name"] == f"sim-ddt#{sim.pk} (simulator)"
    assert run.config["baseline"] == f"sim-ddt#{sim.pk} (simulator)"


@pytest.mark.django_db
def test_a_real_engine_beside_a_simulator_image_is_not_labelled(operator) -> None:  # type: ignore[no-untyped-def]
    real = ready(name="real", gpus=[0])
    real.image = "appliance-engine:abc"
    real.save(update_fields=["image"])
    _reports(["appliance-test-engine:latest"])
    assert bench.target_name(real) == f"real#{real.pk}"
    client = Client()
    client.force_login(operator)
    assert 'id="simulator-banner"' not in client.get("/").content.decode()


def _instructions(text: str) -> list[str]:
    """A Dockerfile's instructions, continuation lines joined."""
    joined_lines = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined_lines.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_sim_hosts_engine_is_the_test_engine_image_step_for_step() -> None:
    engine = _instructions((ROOT / "docker/test-engine/Dockerfile").read_text())
    host = (ROOT / "docker/sim-host/Dockerfile").read_text()
    changes = _instructions((ROOT / "docker/sim-host/engine-image.changes").read_text())
    # Every file the test engine image copies (its context is docker/), but the recordings.
    for line in engine:
        if line.startswith("COPY ") and "recordings" not in line:
            source, target = line.split()[1:3]
            assert f"COPY docker/{source} {target}" in host, line
    # Its settings, as `docker import --change` lines.
    env = next(line for line in engine if line.startswith("ENV "))
    for pair in env.removeprefix("ENV ").split():
        assert f"ENV {pair}" in changes, pair
    for kind in ("ENTRYPOINT", "CMD", "EXPOSE"):
        assert next(line for line in engine if line.startswith(kind)) in changes, kind
    assert any(line.startswith(f"LABEL {SIMULATOR_LABEL}=") for line in changes)
    assert f'{SIMULATOR_LABEL}="' in (ROOT / "docker/test-engine/Dockerfile").read_text()


@pytest.mark.django_db
def test_a_panel_without_gpus_takes_gpu_ids_a_joined_host_states(settings) -> None:  # type: ignore[no-untyped-def]
    def refused(gpus: list[int], host: str) -> list[str]:
        return [f.message for f in host_gpu_inventory_findings(gpus=gpus,
                                                                host=host_facts(name=host))]

    settings.GPU_COUNT = 0
    assert refused([0], "gpu-host")[0].startswith(
        "GPU ids [0] are not on this host: it has 0 GPUs (none, per APPLIANCE_GPU_COUNT on "
        "gpu-host)")
    joined("sim-a", gpus=None, gpu_count=4)
    assert refused([3], "sim-a") == []
    (message,) = refused([4], "sim-a")
    assert "it has 4 GPUs (ids 0 to 3, per the count sim-a states)" in message
    assert refused([3], "gpu-host"), "the panel's own host has its own count, not sim-a's"
    settings.GPU_COUNT = 8
    assert refused([7], "gpu-host") == [], \
        "the panel's own 8 GPUs still count beside a smaller joined host"


def test_the_test_engine_image_is_reported_as_the_simulator(
        docker_client, test_engine_image) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    tags = simulator_tags(docker_client)
    assert test_engine_image in tags
    assert "appliance-base:bookworm" not in tags, "an image without the label is no simulator"


def test_the_trial_file_puts_each_host_on_its_own_network_with_its_own_token() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose not installed")
    done = subprocess.run([compose, "-f", "compose.yaml", "-f", "docker/compose.trial.yaml",
                           "config"], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert {"sim-a", "sim-b", "trial-setup"} <= set(services)
    # web and the gateways reach the hosts over each host's network and the trial's own engine
    # network (compose's, so that `down -v` removes it); a host is on neither of the others.
    for name in ("web", "gateway-a", "gateway-b"):
        assert set(services[name]["networks"]) == {"internal", "engines", "sim-a", "sim-b"}
    for name in ("sim-a", "sim-b"):
        host = services[name]
        # Its own network only: no route to PostgreSQL or Redis, nor to the other host.
        assert set(host["networks"]) == {name}
        assert "APPLIANCE_JOIN_TOKEN" not in host["environment"]
        assert host["environment"]["APPLIANCE_JOIN_TOKEN_FILE"] == "/run/join/token"
        mounts = [str(v) for v in host["volumes"]]
        assert any(f"{name}-token" in m and "/run/join" in m for m in mounts), mounts
        assert not any("-token" in m and name not in m for m in mounts), "no other host's"
        assert "privileged" not in host and host["cap_drop"] == ["SYS_RESOURCE"]
    for name in ("web", "worker", "agent", "loop"):
        env = services[name]["environment"]
        assert env["APPLIANCE_ENGINE_IMAGE"] == "appliance-test-engine:latest"
        assert env["APPLIANCE_GPU_COUNT"] == "0"
        assert any("trial-models" in str(v) and "/models" in str(v)
                   for v in services[name]["volumes"])
