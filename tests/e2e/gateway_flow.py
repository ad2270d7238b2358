"""Serving and verifying as a user does it, end to end, for the compose test (one compose stack,
tests/e2e/test_compose.py): a key made in the panel, a deployment called through the gateway
with the Python `openai` client (streaming), a chat in the playground, the losslessness check
through the gateway from the panel and with `appliance verify`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from playwright.sync_api import Page, expect

from tests.e2e.screenshots import screenshot_path

ROOT = Path(__file__).resolve().parents[2]


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


def key_requests(page: Page, *, url: str, secret: str) -> tuple[int, str]:
    """The keys page's requests and tokens for this key. Read once: the gateway holds a
    stream's [DONE] until its usage is recorded, so a client done reading is counted."""
    page.goto(f"{url}/keys/")
    row = page.locator(f"#key-{secret[:14]}")
    requests, tokens = (row.locator("td").nth(i).inner_text() for i in (5, 6))
    return int(requests), tokens


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


# ---------------------------------------------------------------- the losslessness check

# Planted in the speculative engine (tests/benchmarks/pair.py): a failure at token 5 of the
# built-in "def fibonacci" prompt, a near-tie at token 12 of "The quick brown fox".
PLANTED = "margin:5@def fibonacci,near-tie:12@quick brown"
PLANTED_ENV = f'env: {{TEST_ENGINE_DIVERGE: "{PLANTED}"}}'


def deploy_dflash(page: Page, *, url: str, name: str, model: str, drafter: str, gpu: str,
                  more_spec: str) -> int:
    """A DFLASH deployment from the new-deployment form (site recipe site-e2e)."""
    page.goto(f"{url}/deployments/new/")
    page.select_option("#id_recipe", "site-e2e")
    page.fill("#id_name", name)
    page.fill("#id_model_path", model)
    page.select_option("#id_algorithm", "DFLASH")
    page.fill("#id_drafter_path", drafter)
    page.fill("#id_block_size", "8")
    page.fill("#id_tp_size", "1")
    page.fill("#id_gpu_ids", gpu)
    page.fill("#id_attention_backend", "")
    page.uncheck("#id_self_check")
    page.fill("#id_more_spec", more_spec)
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("h1")).to_have_text(name)
    return int(page.url.rstrip("/").split("/")[-1])


def losslessness_check(page: Page, *, url: str, a: int, b: int) -> dict[str, Any]:
    """A check of A against B from the panel (built-in prompts) through the gateway, as the
    shipped compose file lets the worker reach it (APPLIANCE_GATEWAY_URL); the planted
    failure found at token 5 of the fibonacci prompt, the planted near-tie at token 12 of the
    fox prompt."""
    page.goto(f"{url}/benchmarks/")
    page.click("#verifications")
    page.click("#new-verification")
    page.select_option("#id_candidate", str(a))
    page.select_option("#id_baseline", str(b))
    expect(page.locator("#id_prompt_source")).to_have_value("builtin")
    page.select_option("#id_route", "gateway")
    page.fill("#id_max_tokens", "16")
    started = time.monotonic()
    page.click("#run-verification")
    expect(page.locator("h1")).to_have_text(re.compile(r"Losslessness check #\d+"))
    expect(page.locator("#verify-route")).to_contain_text("through the gateway")
    expect(page.locator("#verify-status")).to_have_text("done", timeout=180_000)
    took = time.monotonic() - started
    expect(page.locator("#verify-verdict")).to_have_text("failed")
    expect(page.locator("#failures")).to_have_text("1")
    expect(page.locator("#near-ties")).to_have_text("1")
    fib = page.locator('#verify-table tbody tr[data-verdict="failure"]')
    expect(fib).to_have_count(1)
    assert "def fibonacci" in fib.locator("td.prompt").inner_text()
    expect(fib.locator("td.position")).to_have_text("5")
    assert float(fib.locator("td.gap").inner_text()) >= 1.5  # a clear margin, not a tie
    fox = page.locator('#verify-table tbody tr[data-verdict="near-tie"]')
    expect(fox).to_have_count(1)
    assert "quick brown" in fox.locator("td.prompt").inner_text()
    expect(fox.locator("td.position")).to_have_text("12")
    page.screenshot(path=screenshot_path("compose-losslessness.png"), full_page=True)
    return {"match_rate": page.locator("#match-rate").inner_text(), "seconds": round(took, 1)}


def cli_verify(*, url: str, secret: str, a_model: str, b_model: str) -> dict[str, Any]:
    """`appliance verify` from the host through the gateway with a key made in the panel, on
    the planted prompts: exit 1, the failure at token 5, the near-tie at token 12."""
    prompts = ("def fibonacci(n):\n    ", "The quick brown fox", "A B C D E F G H I J K L M N O P")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "planted.jsonl"
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "appliance.cli", "verify", "--a", url, "--b", url,
             "--a-model", a_model, "--b-model", b_model, "--api-key", secret, "--prompts",
             str(path), "--max-tokens", "16", "--json"],
            capture_output=True, text=True, cwd=ROOT, timeout=180, check=False)
    assert done.returncode == 1, done.stderr
    assert secret not in done.stdout + done.stderr
    result = json.loads(done.stdout)
    fib, fox, plain = result["prompts"]
    assert (fib["verdict"], fib["position"]) == ("failure", 5) and fib["gap"] >= 1.5
    assert (fox["verdict"], fox["position"], fox["gap"]) == ("near-tie", 12, 0.0625)
    assert plain["verdict"] == "identical"
    assert "does not support return_logprob" in result["a_logprobs"]
    return {"api": result["api"], "compared": result["compared"],
            "seconds": round(time.monotonic() - started, 1),
            "verdicts": [(p["verdict"], p["position"]) for p in result["prompts"]]}


def serve_and_verify(page: Page, *, url: str, served: int, served_name: str, other_name: str,
                     spec_gpu: str) -> dict[str, Any]:
    """Serve and verify on a ready deployment `served`: a key made in the panel, the
    openai client streaming through the gateway with it, a chat in the playground, then a
    DFLASH deployment of the same model with a planted divergence checked against it."""
    secret = make_key(page, url=url, name="e2e-client", deployment_ids=[served])
    page.goto(f"{url}/deployments/{served}/")
    expect(page.locator("#call-model")).to_have_text(served_name)
    expect(page.locator("#call-keys")).to_contain_text(f"Your key 'e2e-client' ({secret[:14]}…)")
    streamed = openai_stream(base_url=f"{url}/v1", secret=secret, model=served_name)
    # Scoped to `served`: another deployment refuses it.
    assert openai_refusal(base_url=f"{url}/v1", secret=secret,
                          model=other_name) is openai.PermissionDeniedError
    counted, tokens = key_requests(page, url=url, secret=secret)
    assert counted == 1, "the streamed call counted against the key (the 403 is not)"
    assert tokens.endswith(f"+ {streamed['completion_tokens']}"), tokens
    chat = playground_chat(page, url=url, pk=served, message="Hello through compose")
    spec = deploy_dflash(page, url=url, name="e2e-spec", model="/models/test",
                         drafter="/models/test-dflash", gpu=spec_gpu, more_spec=PLANTED_ENV)
    expect(page.locator("#status")).to_have_text("ready", timeout=240_000)
    check = losslessness_check(page, url=url, a=spec, b=served)
    both = make_key(page, url=url, name="e2e-verify", deployment_ids=[spec, served])
    cli = cli_verify(url=url, secret=both, a_model="e2e-spec", b_model=served_name)
    streamed.pop("text")
    return {"openai_stream": streamed, "playground": chat, "losslessness": check,
            "verify_cli": cli}
