"""The playground in a real browser: Chromium (Playwright) -> the uvicorn panel's gateway
(/v1/chat/completions with the operator's session) -> the test engine in Docker, streamed
back; each answer's TTFT, tokens/s and accept length, the request as curl, a second turn
that carries the first, and a deployment that is not ready answered plainly (503). Then a key
made in the panel, named on the deployment's page, used by the Python `openai` client."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page, expect

from tests.e2e.gateway_flow import key_requests, make_key, openai_refusal, openai_stream
from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import appliance_stack, login
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]

# Steps of 40 ms: an answer of 48 tokens streams for about half a second, long enough to see
# the text grow before it ends. The pace of loading is each deployment's own (the stack's
# extra env would win over a spec's).
ENGINE_ENV = "TEST_ENGINE_SHARDS=6,TEST_ENGINE_TOKEN_S=0.04,TEST_ENGINE_DECODE_LOG_INTERVAL=10"


def _deploy(name: str, gpu: int, **env: str) -> int:
    data = spec(name=name, env=env, self_check=False, gpus=[gpu])
    return deploying.deployment_create(data=data, confirm_warnings=True).pk


def _wait_status(pk: int, status: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Deployment.objects.filter(pk=pk, status=status).exists():
            return
        time.sleep(0.5)
    raise AssertionError(f"#{pk} not {status}: {Deployment.objects.get(pk=pk).status}")


# Deployments are made before the page: Playwright's loop makes the ORM refuse afterwards.
@pytest.fixture
def ready_and_stalled(operator, tmp_path: Path, test_engine_image: str,  # type: ignore[no-untyped-def]
                      settings) -> Iterator[tuple[str, int, int]]:
    settings.ENGINE_GPU_REQUESTS = False  # as the stack's processes run
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": ENGINE_ENV, "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_METRICS_INTERVAL_S": "1"}
    with appliance_stack(tmp_path, env) as url:
        # chatty loads slowly (seconds), so its page is opened before it is ready; background
        # traffic keeps its decode stats coming.
        ready = _deploy("chatty", 0, TEST_ENGINE_TRAFFIC="1",
                        TEST_ENGINE_PACE_S="0.5")
        stalled = _deploy("stalled", 1, TEST_ENGINE_FAIL="capture-stall",
                          TEST_ENGINE_PACE_S="0.03")
        _wait_status(ready, DeploymentStatus.LOADING)
        yield url, ready, stalled


def _send(page: Page, text: str) -> None:
    page.fill("#pg-message", text)
    page.click("#pg-send")


def test_an_operator_chats_with_a_ready_deployment_and_sees_it_stream_with_its_figures(  # type: ignore[no-untyped-def]
        ready_and_stalled, page: Page) -> None:
    url, ready, stalled = ready_and_stalled
    login(page, url)
    page.goto(f"{url}/deployments/{ready}/")
    # Its page says it will be callable once ready; when the live status turns ready, how to
    # call it: the gateway's base URL, its model name, and no key of the operator's yet.
    expect(page.locator("#call-not-ready")).to_be_visible()
    expect(page.locator("#call-ready")).to_be_hidden()
    expect(page.locator("#status")).to_have_text("ready", timeout=120_000)
    expect(page.locator("#call-ready")).to_be_visible()
    expect(page.locator("#call-not-ready")).to_be_hidden()
    expect(page.locator("#call-base-url")).to_have_text(f"{url}/v1")
    expect(page.locator("#call-model")).to_have_text("chatty")
    expect(page.locator("#call-keys")).to_contain_text("None of your keys may call it")
    page.locator("#how-to-call").screenshot(path=screenshot_path("how-to-call.png"))
    page.click("#open-playground")
    expect(page.locator("h1")).to_have_text("Playground: chatty")
    page.fill("#pg-system", "You are terse.")
    page.fill("#pg-max-tokens", "48")
    # Each change of the answer's text, as the page made it, and whether it was still busy.
    page.evaluate("""() => { window.seen = []; new MutationObserver(() => {
        const t = document.querySelector('#pg-chat .answer .text');
        if (t) window.seen.push([t.textContent, !document.getElementById('pg-stop').hidden]);
      }).observe(document.getElementById('pg-chat'),
                 {childList: true, subtree: true, characterData: true}); }""")
    _send(page, "What does a draft tree do?")

    answer = page.locator("#pg-chat .answer").first
    expect(answer.locator(".text")).not_to_be_empty(timeout=15_000)
    expect(page.locator("#pg-stop")).to_be_hidden(timeout=15_000)
    full = answer.locator(".text").text_content() or ""
    assert "draft" in full or "tree" in full  # the test engine's words
    # Streamed: the text grew piece by piece while the answer was still coming.
    growing = [text for text, busy in page.evaluate("window.seen") if busy and text]
    assert len(set(growing)) >= 3, growing
    assert all(full.startswith(text) for text in growing)

    ttft = answer.locator(".ttft")
    expect(ttft).to_have_attribute("data-value", re.compile(r"^\d+ ms$"))
    assert 0 < int(ttft.get_attribute("data-value").split()[0]) < 10_000
    tps = answer.locator(".tps")
    expect(tps).to_have_attribute("data-value", re.compile(r"^\d+(\.\d)? tokens/s$"))
    assert float(tps.get_attribute("data-value").split()[0]) > 0
    expect(tps).to_contain_text(re.compile(r"\d+ tokens, (the engine's usage|counted as streamed chunks)"))
    accept = answer.locator(".accept")
    # SGLang's OpenAI stream has no meta info: the deployment's decode stats, said so.
    expect(accept).to_have_attribute("data-value", re.compile(r"^\d+\.\d\d$"), timeout=15_000)
    expect(accept).to_contain_text("the deployment's latest decode stats")
    assert 1.0 < float(accept.get_attribute("data-value")) < 6.0

    # The request as curl, key elided: what was sent, pasteable.
    curl = page.locator("#pg-curl").inner_text()
    assert "$SD_API_KEY" in curl and "sk-sd-" not in curl
    words = shlex.split(curl.replace("\\\n", " "))
    assert words[2] == f"{url}/v1/chat/completions"
    body = json.loads(words[words.index("-d") + 1])
    assert body["model"] == "chatty" and body["stream"] is True and body["max_tokens"] == 48
    assert body["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "What does a draft tree do?"}]

    # A second turn carries the first: the history lives in the page.
    _send(page, "And then?")
    expect(page.locator("#pg-chat .answer")).to_have_count(2)
    expect(page.locator("#pg-stop")).to_be_hidden(timeout=15_000)
    expect(page.locator("#pg-chat .answer").nth(1).locator(".ttft")).to_contain_text("ms")
    sent = json.loads(shlex.split(page.locator("#pg-curl").inner_text().replace("\\\n", " "))[-1])
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][2]["content"] == full
    assert len(page.evaluate("AppliancePlayground.history()")) == 4
    expect(page.locator("#pg-error")).to_be_hidden()
    page.screenshot(path=screenshot_path("playground.png"), full_page=True)

    # A key made in the panel for chatty alone: its page names it, the openai client
    # streams through the gateway with it, and the same key may not call another deployment.
    secret = make_key(page, url=url, name="laptop", deployment_ids=[ready])
    page.goto(f"{url}/deployments/{ready}/")
    expect(page.locator("#call-keys")).to_contain_text(
        f"Your key 'laptop' ({secret[:14]}…) may call it.")
    expect(page.locator("#how-to-call")).not_to_contain_text(secret)
    streamed = openai_stream(base_url=f"{url}/v1", secret=secret, model="chatty")
    assert streamed["chunks"] > 1 and "draft" in streamed["text"], streamed
    assert openai_refusal(base_url=f"{url}/v1", secret=secret,
                          model="stalled") is openai.PermissionDeniedError
    assert openai_refusal(base_url=f"{url}/v1", secret="sk-sd-wrong",
                          model="chatty") is openai.AuthenticationError
    # The streamed call counted against the key with its tokens; the refused ones not.
    counted, tokens = key_requests(page, url=url, secret=secret)
    assert counted == 1 and tokens.endswith(f"+ {streamed['completion_tokens']}"), tokens
    page.goto(f"{url}/deployments/{ready}/playground/")

    # A bad input is refused beside the form, nothing sent.
    page.fill("#pg-temperature", "7")
    _send(page, "too hot")
    expect(page.locator("#pg-input-error")).to_contain_text("Temperature must be a number from 0 to 2")
    expect(page.locator("#pg-chat .turn")).to_have_count(0)

    # Not ready: its page says it will be callable once ready, and the gateway's 503 is said
    # plainly in the playground, in one line, no traceback.
    page.goto(f"{url}/deployments/{stalled}/")
    expect(page.locator("#status")).to_have_text("capturing", timeout=60_000)
    expect(page.locator("#call-not-ready")).to_contain_text("callable through the panel's")
    expect(page.locator("#call-ready")).to_be_hidden()
    page.click("#open-playground")
    expect(page.locator("#pg-not-ready")).to_contain_text("not ready")
    _send(page, "Are you there?")
    error = page.locator("#pg-error")
    expect(error).to_contain_text("The gateway answered 503 (not ready)", timeout=15_000)
    assert "Traceback" not in error.inner_text() and "\n" not in error.inner_text().strip()
    expect(page.locator("#pg-chat .answer.failed")).to_have_count(1)
    assert page.evaluate("AppliancePlayground.history()") == []
