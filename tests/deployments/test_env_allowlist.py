"""A spec's env keys and /dev/shm size. Env keys come from the engine's own families or
the names its recipe lists under env_allow; anything else is a 400 naming the key and the
fix. The deny list of loader and shell variables wins over both."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client, override_settings

from appliance.engine.recipes import RECIPES_DIR
from tests.specs import spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(operator) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    return client


def _preflight(client: Client, env: dict[str, str], **changes: object):  # type: ignore[no-untyped-def]
    return client.post("/api/preflight/", {"spec": spec(env=env, **changes)},
                       content_type="application/json")


@pytest.mark.parametrize("key", ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "NCCL_DEBUG",
                                 "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_CUDA_ARCH_LIST",
                                 "PYTORCH_CUDA_ALLOC_CONF", "TRITON_CACHE_DIR",
                                 "FLASHINFER_WORKSPACE_BASE", "HF_HUB_OFFLINE",
                                 "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                                 "OMP_NUM_THREADS"])
def test_the_engines_own_variables_are_accepted(client: Client, key: str) -> None:
    response = _preflight(client, {key: "1"})
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("key", ["MY_VAR", "HTTP_PROXY", "HF_HOME", "nccl_debug"])
def test_any_other_key_is_refused_naming_it_and_the_fix(client: Client, key: str) -> None:
    response = _preflight(client, {key: "1"})
    assert response.status_code == 400
    (message,) = response.json()[f"env.{key}"]
    assert key in message and "env_allow" in message


def test_the_test_engines_knobs_need_the_setting(client: Client) -> None:
    with override_settings(ENGINE_TEST_ENV=False):
        refused = _preflight(client, {"TEST_ENGINE_FAIL": "load-exit"})
    assert refused.status_code == 400 and "env.TEST_ENGINE_FAIL" in refused.json()
    assert _preflight(client, {"TEST_ENGINE_FAIL": "load-exit"}).status_code == 200


def _site_recipe(directory: Path, allow: list[str]) -> str:
    text = (RECIPES_DIR / "kimi-k2.6-ddtree.yaml").read_text()
    text = text.replace("name: kimi-k2.6-ddtree", "name: site-env")
    text = text.replace("lock: kimi-k2.6-ddtree.lock.txt\n", "")
    (directory / "site-env.yaml").write_text(text + f"env_allow: {allow}\n")
    return "site-env"


def test_a_recipe_allows_the_names_it_declares_but_never_a_loader_variable(
        client: Client, tmp_path: Path) -> None:
    name = _site_recipe(tmp_path, ["MY_VAR", "LD_PRELOAD"])
    with override_settings(RECIPES_DIR=str(tmp_path)):
        assert _preflight(client, {"MY_VAR": "1"}, recipe=name).status_code == 200
        assert _preflight(client, {"OTHER": "1"}, recipe=name).status_code == 400
        loader = _preflight(client, {"LD_PRELOAD": "/tmp/x.so"}, recipe=name)
    assert loader.status_code == 400 and "refused" in loader.json()["env.LD_PRELOAD"][0]


def test_a_refused_key_stores_nothing(client: Client) -> None:
    response = client.post("/api/deployments/", {"spec": spec(env={"MY_VAR": "1"}),
                                                  "confirm_warnings": True},
                           content_type="application/json")
    assert response.status_code == 400 and "env.MY_VAR" in response.json()


def test_the_container_plan_sizes_dev_shm_from_the_spec_else_the_setting(client: Client) -> None:
    from tests.plans import own_host_plan
    from web.deployments.models import Deployment

    def plan_of(**changes: object) -> str:
        response = client.post("/api/deployments/", {"spec": spec(**changes),
                                                      "confirm_warnings": True},
                               content_type="application/json")
        assert response.status_code == 201, response.json()
        deployment = Deployment.objects.get(pk=response.json()["id"])
        # The agent's setting: its environment's APPLIANCE_ENGINE_SHM_SIZE.
        return str(own_host_plan(deployment, "img", APPLIANCE_ENGINE_SHM_SIZE="48g").shm_size)

    assert plan_of(name="sized", shm_size="96g") == "96g"
    assert plan_of(name="default", gpus=[1]) == "48g"  # GPU 0 is leased to "sized"
    refused = client.post("/api/deployments/", {"spec": spec(shm_size="100t")},
                          content_type="application/json")
    assert refused.status_code == 400 and "64m to 2t" in refused.json()["shm_size"][0]
