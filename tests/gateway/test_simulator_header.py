"""A /v1 answer from the simulator says so in its headers (x-appliance-simulator: true), as
the panel's banner does; an answer from any other engine carries no such header. Through the
panel's uvicorn, real PostgreSQL and Redis, with OpenAI stand-ins as the engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.utils import timezone

from tests.hostrows import host_reported
from tests.openai_standin import standin
from tests.servers import panel_server
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)
SIMULATOR = "appliance-test-engine:latest"


@pytest.fixture
def gateway(tmp_path: Path, live_channel) -> Iterator[str]:  # type: ignore[no-untyped-def]
    # The host's report first: the panel reads the hosts' simulator images when it starts.
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"nvidia": False, "gpu_requests": False,
                          "simulator_images": [SIMULATOR]})
    with panel_server(tmp_path / "uvicorn.log") as url:
        yield url


def _deployment(name: str, url: str, image: str) -> Deployment:
    data = spec(name=name, engine__served_model_name=name)
    return Deployment.objects.create(
        name=name, spec=data, recipe=data["recipe"], algorithm="NONE", gpus=data["gpus"],
        status=DeploymentStatus.READY, engine_url=url, image=image)


def test_the_simulators_answers_say_so_in_a_header(gateway: str, operator: Any,
                                                   key_for: Any) -> None:
    with standin(model="simulated") as sim, standin(model="real") as real:
        _deployment("simulated", sim.url, SIMULATOR)
        _deployment("real", real.url, "appliance-engine:kimi-433c58ed7")
        auth = {"Authorization": f"Bearer {key_for(operator)}"}
        for model, stream, said in (("simulated", False, "true"), ("simulated", True, "true"),
                                    ("real", False, None)):
            answer = requests.post(f"{gateway}/v1/chat/completions", headers=auth, timeout=30,
                                   json={"model": model, "max_tokens": 4, "stream": stream,
                                         "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200, answer.text
            assert answer.headers.get("x-appliance-simulator") == said, (model, stream)
