"""The test engine refuses per mode what 433c58ed7 refused, as it answered it: each recorded
request of refusals_{ddtree,dflash,base}/refusals.json sent to the test engine launched in
that mode, its status and refusal held to the recording (real Docker)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from appliance.engine.refusals import request_needs
from tests.conftest_docker import (  # noqa: F401 (fixtures)
    ddtree_argv,
    docker_client,
    health_code,
    host_port,
    run_test_engine,
    test_engine_image,
    wait_for,
)
from tests.real_engine import folder

pytestmark = pytest.mark.docker


def _argv(mode: str) -> list[str]:
    argv = ddtree_argv()
    if mode == "DDTREE":
        return argv
    at = argv.index("--speculative-algorithm")
    if mode == "DFLASH":
        argv[at + 1] = "DFLASH"
        budget = argv.index("--speculative-ddtree-budget")
        return argv[:budget] + argv[budget + 2:]
    end = argv.index("--attention-backend")  # no speculation: none of its flags
    return argv[:at] + argv[end:]


def _answer(response: requests.Response) -> tuple[int, str | None]:
    """(status, the refusal's message or None when served), read as the recording is."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        first = response.text.split("\n\n")[0].removeprefix("data: ")
        error = json.loads(first).get("error")
        return response.status_code, error["message"] if error else None
    body = response.json()
    return response.status_code, body.get("message") if response.status_code >= 400 else None


def _recorded(answer: dict[str, Any]) -> tuple[int, str | None]:
    body = answer["body"]
    if isinstance(body, str):
        error = json.loads(body.split("\n\n")[0].removeprefix("data: ")).get("error")
        return answer["status"], error["message"] if error else None
    return answer["status"], body.get("message") if answer["status"] >= 400 else None


@pytest.mark.parametrize("mode,run", [("DDTREE", "refusals_ddtree"),
                                      ("DFLASH", "refusals_dflash"),
                                      ("NONE", "refusals_base")])
def test_the_test_engine_answers_each_recorded_refusal_request_as_the_real_engine_did(
        run_test_engine: Any, mode: str, run: str) -> None:  # noqa: F811
    container = run_test_engine(argv=_argv(mode))
    url = f"http://127.0.0.1:{host_port(container)}"
    wait_for(lambda: health_code(url) == 200, 30)
    recorded = json.loads((folder(run) / "refusals.json").read_text())
    checked = []
    for answer in recorded:
        chat = answer["path"].endswith("/chat/completions")
        if not request_needs(answer["sent"], chat=chat):
            continue  # stop strings, context length: no mode's refusal
        response = requests.post(url + answer["path"], json=answer["sent"], timeout=30)
        assert _answer(response) == _recorded(answer), (mode, answer["name"])
        checked.append(answer["name"])
    assert {"json_schema", "json_schema_stream", "json_object", "tool_required",
            "logprobs_chat", "logprobs_chat_stream", "logprobs_completion", "n2"} <= set(checked)
