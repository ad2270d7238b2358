"""What the gateway hands to a companion follows the deployment's engine build (its recipe's
SGLang source), not its algorithm's name (appliance/engine/refusals.py): DFLASH on SGLang
0.5.23 serves log-probs and grammar itself (0.5.23's validate_dflash_request, a source
reading), DDTREE on 433c58ed7 refuses them (recorded), so its requests go to the companion.
Through the panel's uvicorn, real PostgreSQL and Redis, OpenAI stand-ins as the engines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from appliance.engine.refusals import recipe_source
from tests.openai_standin import standin
from tests.servers import panel_server
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)

LOGPROBS = {"logprobs": True, "top_logprobs": 2}
GRAMMAR = {"response_format": {"type": "json_object"}}


@pytest.fixture
def gateway(tmp_path: Path, live_channel) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log") as url:
        yield url


def _deployment(name: str, url: str, *, recipe: str, algorithm: str, served: str,
                companion: str | None = None) -> Deployment:
    data = spec(name=name, recipe=recipe, engine__served_model_name=served,
                engine__speculative_algorithm=algorithm, companion=companion)
    return Deployment.objects.create(name=name, spec=data, recipe=recipe, algorithm=algorithm,
                                     gpus=data["gpus"], status=DeploymentStatus.READY,
                                     engine_url=url)


def _call(url: str, secret: str, model: str, **extra: Any) -> requests.Response:
    body = {"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello"}], **extra}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {secret}"})


def _until_companion_known(url: str, secret: str, model: str) -> requests.Response:
    """The first answer once the gateway's table holds the companion (a 503
    companion_not_ready before: the rows were made a moment ago), within 10 s."""
    deadline = time.monotonic() + 10
    while True:
        answer = _call(url, secret, model, **LOGPROBS)
        if answer.status_code != 503 or time.monotonic() > deadline:
            return answer
        assert answer.json()["error"]["code"] == "companion_not_ready", answer.text
        time.sleep(0.1)


def test_the_recipes_pin_the_builds_the_test_names() -> None:
    assert recipe_source("kimi-k2.6-dflash", None) == "0.5.23"
    assert recipe_source("kimi-k2.6-baseline", None) == "0.5.23"
    assert recipe_source("kimi-k2.6-ddtree", None) == "433c58ed7"


def test_log_probs_to_dflash_on_0_5_23_are_served_by_it_and_to_ddtree_on_433c58ed7_by_the_companion(
        gateway: str, operator: Any, key_for: Any) -> None:
    with standin(model="dflash-model") as dflash, standin(logprobs=False, model="ddtree-model") \
            as ddtree, standin(model="base-model") as base:
        _deployment("kimi-base", base.url, recipe="kimi-k2.6-baseline", algorithm="NONE",
                    served="base-model")
        rows = [_deployment("kimi-dflash", dflash.url, recipe="kimi-k2.6-dflash",
                            algorithm="DFLASH", served="dflash-model", companion="kimi-base"),
                _deployment("kimi-ddtree", ddtree.url, recipe="kimi-k2.6-ddtree",
                            algorithm="DDTREE", served="ddtree-model", companion="kimi-base")]
        secret = key_for(operator, deployments=rows)  # the companion is not in scope
        handed = _until_companion_known(gateway, secret, "ddtree-model")
        assert handed.status_code == 200, handed.text
        assert handed.headers["x-appliance-served-by"] == "kimi-base"
        assert handed.json()["choices"][0]["logprobs"]["content"]
        assert not ddtree.seen and base.seen[-1]["model"] == "base-model"
        grammar = _call(gateway, secret, "ddtree-model", **GRAMMAR)
        assert grammar.headers["x-appliance-served-by"] == "kimi-base"
        assert not ddtree.seen

        base_before = len(base.seen)
        served = _call(gateway, secret, "dflash-model", **LOGPROBS)
        assert served.status_code == 200, served.text
        assert "x-appliance-served-by" not in served.headers
        assert served.json()["choices"][0]["logprobs"]["content"]
        assert [s["logprobs"] for s in dflash.seen] == [True]  # the engine itself was asked
        grammar = _call(gateway, secret, "dflash-model", **GRAMMAR)
        assert grammar.status_code == 200 and "x-appliance-served-by" not in grammar.headers
        assert dflash.seen[-1]["response_format"] == {"type": "json_object"}
        assert len(base.seen) == base_before  # nothing of DFLASH's went to the companion


def test_without_a_companion_dflash_on_0_5_23_still_serves_what_ddtree_gets_a_400_for(
        gateway: str, operator: Any, key_for: Any) -> None:
    with standin(model="dflash-model") as dflash, standin(logprobs=False, model="ddtree-model") \
            as ddtree:
        _deployment("lone-dflash", dflash.url, recipe="kimi-k2.6-dflash", algorithm="DFLASH",
                    served="dflash-model")
        _deployment("lone-ddtree", ddtree.url, recipe="kimi-k2.6-ddtree", algorithm="DDTREE",
                    served="ddtree-model")
        secret = key_for(operator)
        assert _call(gateway, secret, "dflash-model", **LOGPROBS).status_code == 200
        assert len(dflash.seen) == 1
        refused = _call(gateway, secret, "ddtree-model", **LOGPROBS)
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert message.startswith("DDTREE cannot return log-probs on SGLang 433c58ed7"), message
        assert not ddtree.seen
