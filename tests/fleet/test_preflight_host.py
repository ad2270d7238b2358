"""Pre-flight checks a spec against the host placement chose for it: that host's secret
store, Docker and GPUs, never another host's report. Two joined hosts differ in one fact;
the spec passes or is refused according to the host it is placed on, and the answer (the
service's, the API's, the panel form's) names that host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from tests.rows import queued
from tests.specs import spec
from web.deploy import checks
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment

from .hosts import DOCKER, joined

pytestmark = pytest.mark.django_db

BLACKWELL = [{"index": i, "name": "NVIDIA B200", "compute_capability": "10.0"}
             for i in range(8)]


@pytest.fixture(autouse=True)
def gpu_less_panel(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A panel whose own host has no GPUs (every engine runs on a joined host) and whose
    own secret store is empty: only the joined hosts' reports can satisfy a spec."""
    settings.GPU_COUNT = 0
    settings.ENGINE_SECRETS_DIR = str(tmp_path)


def _refusal(**changes: object) -> services.DeploymentInputError:
    with pytest.raises(services.DeploymentInputError) as caught:
        queued(**changes)
    return caught.value


def test_a_secret_only_one_host_holds_passes_there_and_is_refused_where_placement_goes(
        ) -> None:
    joined("gpu-2", secret_names=["HF_TOKEN"])
    joined("gpu-3", secret_names=[])
    checked = checks.deployment_check(data=spec(secrets=["HF_TOKEN"], gpus=[0]))
    assert checked.host == "gpu-2"  # both free: the first by name
    assert "secret-missing" not in {f.rule for f in checked.findings}
    holder = queued(name="holder", gpus=[0])  # takes gpu-2's GPU 0: the next goes to gpu-3
    assert holder.host == "gpu-2"
    refused = _refusal(name="second", secrets=["HF_TOKEN"], gpus=[0])
    assert refused.host == "gpu-3"
    [message] = refused.errors["secrets"]
    assert "secret HF_TOKEN is not in the engine secret store" in message, message
    assert list(Deployment.objects.values_list("name", flat=True)) == ["holder"]
    # Named, the host holding the secret takes it (GPU 1 free there).
    made = queued(name="second", secrets=["HF_TOKEN"], gpus=[1], host="gpu-2")
    assert made.host == "gpu-2"
    assert "secret-missing" not in {f["rule"] for f in made.preflight}


def test_a_hosts_docker_without_nvidia_refuses_gpus_only_on_that_host() -> None:
    joined("gpu-2")
    joined("gpu-3", docker={**DOCKER, "runtimes": ["runc"], "nvidia": False})
    refused = _refusal(gpus=[0], host="gpu-3")
    assert refused.host == "gpu-3"
    assert "this host's Docker has no NVIDIA runtime (gpu-3: runtimes runc)" in \
        refused.errors["gpus"][0]
    # gpu-3's report says nothing about gpu-2, where placement puts a spec without host:.
    made = queued(gpus=[0])
    assert made.host == "gpu-2" and "host-gpu-runtime" not in {f["rule"] for f in made.preflight}


def test_the_gpu_architecture_checked_is_the_placed_hosts() -> None:
    joined("gpu-2", gpus=BLACKWELL)  # fa3 has no kernels for Blackwell
    joined("gpu-3")  # H200s
    refused = _refusal(gpus=[0], host="gpu-2")
    assert "[gpu-arch-attention-backend]" in " ".join(refused.errors["engine.attention_backend"])
    assert refused.host == "gpu-2"
    assert queued(gpus=[0], host="gpu-3").host == "gpu-3"


def test_replicas_on_two_hosts_are_checked_on_both_and_each_row_keeps_its_hosts_findings(
        ) -> None:
    joined("gpu-2", secret_names=["HF_TOKEN"])
    joined("gpu-3", secret_names=[])
    refused = _refusal(secrets=["HF_TOKEN"], gpus=[0], replicas=2)
    assert refused.host == "gpu-2, gpu-3"
    [message] = refused.errors["secrets"]
    assert message.startswith("On host gpu-3: secret HF_TOKEN is not in the engine secret store")
    assert not Deployment.objects.exists()
    joined("gpu-3", secret_names=["HF_TOKEN"])  # a join again, its store filled
    first = queued(secrets=["HF_TOKEN"], gpus=[0], replicas=2)
    rows = [first, *Deployment.objects.filter(replica_of=first)]
    assert sorted(r.host for r in rows) == ["gpu-2", "gpu-3"]
    assert all("secret-missing" not in {f["rule"] for f in r.preflight} for r in rows)


def test_the_api_and_the_form_name_the_host_they_checked(operator) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2", secret_names=["HF_TOKEN"])
    joined("gpu-3", secret_names=[])
    client = Client()
    client.force_login(operator)

    def preflight(**changes: object):  # type: ignore[no-untyped-def]
        return client.post("/api/preflight/", json.dumps({"spec": spec(**changes)}),
                           content_type="application/json")

    answer = preflight(secrets=["HF_TOKEN"], gpus=[0])
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["host"] == "gpu-2" and body["ok"] is True
    assert [(p["replica"], p["host"], p["gpus"]) for p in body["placement"]] == [
        (0, "gpu-2", [0])]
    answer = preflight(secrets=["HF_TOKEN"], gpus=[0], host="gpu-3")
    assert answer.status_code == 400
    assert answer.json()["preflight_host"] == "gpu-3"
    assert "HF_TOKEN" in " ".join(answer.json()["secrets"])
    # Placement's refusal is answered as deploying answers it, before any rule runs.
    answer = preflight(gpus=[8])
    assert answer.status_code == 400 and "Replica 0 needs GPU 8 free on one host" in \
        answer.json()["gpus"][0], answer.json()
    # The panel's form says where it checked, beside the findings.
    form = client.post("/deployments/new/", {
        "name": "form", "recipe": "kimi-k2.6-ddtree", "model_path": "/models/Kimi-K2.6",
        "algorithm": "NONE", "tp_size": 1, "gpu_ids": "0", "replicas": 1, "host": "gpu-3",
        "more_spec": "secrets: [HF_TOKEN]", "confirm_warnings": "on"})
    page = form.content.decode()
    assert form.status_code == 400
    assert 'id="preflight-host">Checked against host gpu-3' in page, page[-3000:]


def test_a_scale_checks_the_host_each_new_replica_goes_to() -> None:
    joined("gpu-2", secret_names=["HF_TOKEN"])
    joined("gpu-3", secret_names=[])
    first = queued(secrets=["HF_TOKEN"], gpus=[0])
    assert first.host == "gpu-2"
    with pytest.raises(services.DeploymentInputError) as caught:
        deploying.deployment_scale(deployment_id=first.pk, replicas=2)  # spread: gpu-3
    assert caught.value.host == "gpu-3"
    assert "secret HF_TOKEN is not in the engine secret store" in caught.value.errors["secrets"][0]
    assert list(Deployment.objects.values_list("pk", flat=True)) == [first.pk]
    joined("gpu-3", secret_names=["HF_TOKEN"])
    deploying.deployment_scale(deployment_id=first.pk, replicas=2)
    replica = Deployment.objects.get(replica_of=first)
    assert replica.host == "gpu-3"
    assert "secret-missing" not in {f["rule"] for f in replica.preflight}


def test_a_driver_older_than_the_images_cuda_is_refused_only_on_that_host() -> None:
    """The recipe's image is CUDA 13 (nvidia/cuda:13.0.1-...), whose user space needs an
    R580 driver: pre-flight refuses it on the host whose agent reports an older one, before
    an image is built or started there (the image's self-check would refuse it only then)."""
    joined("gpu-2", driver_version="570.133.20")
    joined("gpu-3", driver_version="580.65.06")
    refused = _refusal(gpus=[0], host="gpu-2")
    assert refused.host == "gpu-2"
    [message] = refused.errors["gpus"]
    assert "host gpu-2's NVIDIA driver is 570.133.20" in message, message
    assert "CUDA 13, which needs driver 580 or newer" in message
    assert "[host-driver-too-old]" in message
    assert list(Deployment.objects.values_list("name", flat=True)) == []
    made = queued(gpus=[0], host="gpu-3")
    assert "host-driver-too-old" not in {f["rule"] for f in made.preflight}
    # Without host:, placement chooses gpu-2 first (by name) and pre-flight checks it there.
    assert _refusal(name="second", gpus=[1]).host == "gpu-2"


def test_the_driver_rule_needs_a_known_driver_and_cuda_version() -> None:
    from web.deployments.services.hosts import host_driver_findings
    from web.fleet.hostfacts import host_facts

    joined("gpu-2", driver_version="535.183.01")
    joined("gpu-3")  # an agent that sends no driver version (no NVML, or an older agent)
    old, unknown = host_facts(name="gpu-2"), host_facts(name="gpu-3")
    assert old.driver_version == "535.183.01" and unknown.driver_version is None
    cuda13 = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    assert [f.rule for f in host_driver_findings(gpus=[0], host=old, base_image=cuda13)] == \
        ["host-driver-too-old"]
    # CUDA 12's user space runs on R525 and newer.
    assert host_driver_findings(gpus=[0], host=old,
                                base_image="docker.io/nvidia/cuda:12.9.1-devel-ubuntu22.04") == []
    assert host_driver_findings(gpus=[0], host=unknown, base_image=cuda13) == []
    assert host_driver_findings(gpus=[0], host=old, base_image="appliance-base:bookworm") == []
    assert host_driver_findings(gpus=[], host=old, base_image=cuda13) == []  # no GPUs asked


def test_the_driver_the_real_engines_host_reported_passes_the_rule() -> None:
    """The H200 the real engine ran on (tests/fixtures/real-engine, the image's self-check
    output: NVML's driver and the CUDA 13.0 it supports) passes where the recipe's CUDA 13
    image is checked."""
    import dataclasses

    from appliance.engine.recipes import load_recipe
    from web.deployments.services.hosts import host_driver_findings
    from web.fleet.hostfacts import host_facts

    stream = (Path(__file__).parents[1] / "fixtures/real-engine/433c58ed7/ddtree_probe/"
              "selfcheck.stream").read_text()
    said = next(json.loads(line.split(": ", 1)[1]) for line in stream.splitlines()
                if '"event":"gpus"' in line)
    assert said["cuda_driver_version"] == "13.0"
    joined("gpu-2", driver_version=said["driver_version"])
    facts = host_facts(name="gpu-2")
    image = load_recipe("kimi-k2.6-ddtree").base_image
    assert host_driver_findings(gpus=[0], host=facts, base_image=image) == []
    older = dataclasses.replace(facts, driver_version="575.57.08")
    assert [f.rule for f in host_driver_findings(gpus=[0], host=older, base_image=image)] == \
        ["host-driver-too-old"]
