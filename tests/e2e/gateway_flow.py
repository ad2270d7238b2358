"""Issue 21's 'Done when' steps as a user takes them, for the compose test (one compose stack,
tests/e2e/test_compose.py): a key made in the panel, a deployment called through the gateway
with the Python `openai` client (streaming), a chat in the playground."""

from __future__ import annotations

import re
import time
from typing import Any

import openai
from playwright.sync_api import Page, expect

from tests.e2e.screenshots import screenshot_path


def make_key(page: Page, *, url: str, name: str, deployment_ids: list[int]) -> str:
    """A key made on the panel's keys page, scoped to these deployments; the secret it shows
    once."""
    page.goto(f"{url}/keys/")
    page.fill("#id_name", name)
    for pk in deployment_ids:
        page.check(f'input[name="deployments"][value="{pk}"]')
    page.click("#key-form button[type=submit]")
    shown = page.locator("#new-key code.token")
    expect(shown).to_have_text(re.compile(r"^sk-sd-\S+$"))
    return shown.inner_text()


def openai_stream(*, base_url: str, secret: str, model: str, max_tokens: int = 24
                  ) -> dict[str, Any]:
    """One streamed chat completion with the official client; its figures."""
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=60)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True})
    pieces: list[str] = []
    first: float | None = None
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic()
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    ended = time.monotonic()
    assert len(pieces) > 1, f"streamed in pieces, not at once: {pieces}"
    assert usage is not None and usage.completion_tokens == max_tokens, usage
    assert first is not None
    return {"chunks": len(pieces), "completion_tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens, "ttft_ms": round((first - started) * 1000, 1),
            "total_ms": round((ended - started) * 1000, 1), "text": "".join(pieces)}


def openai_refusal(*, base_url: str, secret: str, model: str) -> type[Exception]:
    """The client's exception class for a call the gateway refuses (401, 403, 404, 503)."""
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=30)
    try:
        client.chat.completions.create(model=model, max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as exc:
        return type(exc)
    raise AssertionError(f"the gateway let {model} be called")


def playground_chat(page: Page, *, url: str, pk: int, message: str) -> dict[str, str]:
    """From the deployment's page to its playground, one message; the answer's figures."""
    page.goto(f"{url}/deployments/{pk}/")
    page.click("#open-playground")
    expect(page.locator("h1")).to_contain_text("Playground: ")
    page.fill("#pg-max-tokens", "32")
    page.fill("#pg-message", message)
    page.click("#pg-send")
    answer = page.locator("#pg-chat .answer").last
    expect(answer.locator(".ttft")).to_have_attribute("data-value", re.compile(r"^\d+ ms$"),
                                                      timeout=60_000)
    expect(answer.locator(".tps")).to_have_attribute("data-value",
                                                     re.compile(r"tokens/s$"))
    expect(answer.locator(".accept")).to_contain_text("accept length", timeout=15_000)
    expect(page.locator("#pg-error")).to_be_hidden()
    text = answer.locator(".text").text_content() or ""
    assert text.strip(), "the playground showed the answer's text"
    page.screenshot(path=screenshot_path("compose-playground.png"), full_page=True)
    return {"ttft": answer.locator(".ttft").get_attribute("data-value") or "",
            "tokens_per_s": answer.locator(".tps").get_attribute("data-value") or "",
            "accept": answer.locator(".accept").inner_text()}
