"""Every endpoint that could take a body, sent deep and wide documents through the panel's real
uvicorn: JSON and YAML nested 900 to 500,000 levels, wide ones, bodies over the limit, and the
same deep documents inside the fields that are parsed later (a benchmark's prompts, a form's
More spec keys box, an uploaded prompt file). Nothing answers 5xx, nothing takes long, the
server logs no traceback, and where the body is parsed the answer names the limit.

The endpoints are read from the URL conf (and the gateway's own routes), so a new one is sent
the same documents without this file changing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.urls import URLPattern, URLResolver, get_resolver

from tests.servers import login_session, panel_server
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.spec_yaml import MAX_JSON_DEPTH
from web.gateway import proxy
from web.gateway.services import apikey_create

pytestmark = pytest.mark.django_db(transaction=True)

# Generous for a loaded 2-core test machine: YAML nested 50,000 levels took 150 s before.
SECONDS_PER_REQUEST = 5.0
DEEP_MARK = "nested deeper than"


def deep_json(levels: int, opener: str = "[") -> str:
    closer = {"[": "]", '{"a": ': "}"}[opener]
    return opener * levels + "1" * (opener != "[") + closer * levels


def wide_json() -> str:
    return "[" + ",".join(['{"a": [1, {"b": "c"}]}'] * 40_000) + "]"  # ~900 KB, 4 deep


# Raw bodies: (name, content type, body).
RAW_BODIES = [
    ("json nested 900", "application/json", deep_json(900)),
    ("json nested 100,000", "application/json", deep_json(100_000)),
    ("json objects nested 5,000", "application/json", deep_json(5_000, '{"a": ')),
    ("json unclosed 500,000", "application/json", "[" * 500_000),
    ("json wide", "application/json", wide_json()),
    ("yaml flow nested 900", "application/yaml", deep_json(900)),
    ("yaml flow nested 50,000", "application/yaml", deep_json(50_000)),
    ("yaml block nested 50,000", "application/yaml", "- " * 50_000 + "x"),
    ("yaml mapping nested 1,000", "application/yaml",
     "".join(" " * i + "a:\n" for i in range(1_000))),
    ("over the size limit", "application/json", "[" + "1," * 1_100_000 + "1]"),
]

DEEP_DOCS = {"jsonl": deep_json(5_000, '{"a": '), "sharegpt": deep_json(100_000)}
DEEP_YAML = "- " * 1_900 + "x"  # block style, under the More spec keys box's 4,000 characters


def _paths() -> Iterator[tuple[str, str]]:
    """(name, path) of every URL pattern, path parameters filled in: `pk` with the target
    deployment's id (TARGET_PK), others with a value of their type."""
    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield str(p.name), prefix + str(p.pattern)
    for route in proxy.ROUTES:  # first: a revoke endpoint sent the target's id may hit the key
        yield "gateway", route
    for name, route in walk(get_resolver().url_patterns, ""):
        path = re.sub(r"<(?:\w+:)?pk>|\(\?P<pk>[^)]*\)", "{pk}", route)
        path = re.sub(r"<(?:int:)?\w+>|\(\?P<\w+>[^)]*\)", "1", path)
        path = path.replace("^", "").replace("$", "").replace("\\", "")
        yield name, "/" + path


@pytest.fixture
def world(django_user_model, operator):  # type: ignore[no-untyped-def]
    """The target of every `pk` (queued), and ready deployments a benchmark and a
    losslessness check may name, so their bodies get as far as their prompts."""
    target = Deployment.objects.create(name="target", spec=spec(name="target"),
                                       recipe="kimi-k2.6-ddtree", algorithm="DDTREE", gpus=[0])
    ready = {}
    for name, algorithm in (("cand", "DDTREE"), ("base", "NONE")):
        data = spec(name=name, engine__speculative_algorithm=algorithm)
        ready[name] = Deployment.objects.create(
            name=name, spec=data, recipe=data["recipe"], algorithm=algorithm, gpus=[1],
            status=DeploymentStatus.READY, engine_url="http://127.0.0.1:9")
    return target, ready


def _fields(ready: dict[str, Deployment], source: str) -> dict[str, Any]:
    """The body fields of every create form and endpoint, the parsed ones deep."""
    return {"deployments": [ready["cand"].pk], "candidate": ready["cand"].pk,
            "baseline": ready["base"].pk, "prompt_source": source, "num_prompts": 1, "levels": [1],
            "prompts": DEEP_DOCS[source], "more_spec": DEEP_YAML, "name": "fuzz",
            "recipe": "kimi-k2.6-ddtree", "model_path": "/models/Kimi-K2.6",
            "algorithm": "NONE", "tp_size": 1, "gpu_ids": "2", "confirm_warnings": "on"}


def _form(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[0] if isinstance(v, list) else v) for k, v in fields.items()}


def test_no_endpoint_answers_a_deep_or_wide_body_with_a_server_error(tmp_path: Path, live_channel, operator, token_for, world) -> None:  # type: ignore[no-untyped-def]
    target, ready = world
    log = tmp_path / "uvicorn.log"
    token = {"Authorization": f"Token {token_for(operator)}"}
    key = {"Authorization": "Bearer " + apikey_create(owner_username=operator.username,
                                                      name="fuzz").secret}
    failures: list[str] = []
    named: dict[str, list[str]] = {}  # path -> the answers that named the depth limit
    sent = 0
    with panel_server(log) as url:
        session = login_session(url, "otto", "operator-pass-1")
        csrf = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": url + "/"}

        def send(what: str, path: str, **kw: Any) -> None:
            nonlocal sent
            auth = key if path.startswith("/v1/") else token if path.startswith("/api/") \
                else csrf
            caller = session if auth is csrf else requests
            started = time.monotonic()
            try:
                answer = caller.post(url + path, headers={**auth, **kw.pop("headers", {})},
                                     timeout=60, allow_redirects=False, **kw)
            except requests.RequestException as exc:
                failures.append(f"POST {path} {what}: {exc}")
                return
            took = time.monotonic() - started
            sent += 1
            if answer.status_code >= 500 or took > SECONDS_PER_REQUEST:
                failures.append(f"POST {path} {what}: {answer.status_code} in {took:.1f} s: "
                                f"{answer.text[:200]}")
            if DEEP_MARK in answer.text:
                named.setdefault(path, []).append(what)

        # Logging out last: the form posts after it would be sent to the login page.
        for _, pattern in sorted(_paths(), key=lambda p: "logout" in p[0]):
            path = pattern.format(pk=target.pk)
            for what, kind, body in RAW_BODIES:
                send(what, path, data=body.encode(), headers={"Content-Type": kind})
            for source in DEEP_DOCS:
                fields = _fields(ready, source)
                send(f"deep {source} prompts in json", path, json=fields)
                send(f"deep {source} prompts in a form", path, data=_form(fields),
                     files={"prompts_file": ("p.jsonl", DEEP_DOCS[source].encode())})
    print(f"{sent} requests, {len(failures)} failures")
    assert not failures, "\n".join(failures[:30])
    assert sent > 1_000
    text = log.read_text()
    assert "Traceback" not in text, text[text.find("Traceback") - 300:][:4000]
    # Where the body (or a field of it) is parsed, the answer names the limit.
    for path in ("/api/deployments/", "/api/preflight/"):
        assert {"json nested 900", "yaml flow nested 50,000", "yaml block nested 50,000",
                "yaml mapping nested 1,000"} <= set(named.get(path, [])), (path, named.get(path))
    for path in ("/api/benchmarks/", "/benchmarks/new/", "/api/verifications/",
                 "/benchmarks/verifications/new/"):
        assert any("deep jsonl" in what for what in named.get(path, [])), (path, named)
    assert "deep jsonl prompts in a form" in named.get("/deployments/new/", [])  # More spec
    for path in proxy.ROUTES:
        if proxy.ROUTES[path] == "POST":
            assert "json nested 100,000" in named.get(path, []), (path, named.get(path))


def test_the_depth_limits_name_themselves(operator) -> None:  # type: ignore[no-untyped-def]
    """The messages the fuzz test looks for say the limit and what to send instead."""
    from django.test import Client
    client = Client()
    client.force_login(operator)
    answer = client.post("/api/deployments/", deep_json(900), content_type="application/yaml")
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        f"YAML parse error - {DEEP_MARK} {MAX_JSON_DEPTH} levels (a deployment spec is 4 "
        f"levels deep; send the spec itself): over {4 * MAX_JSON_DEPTH} [ or {{ open at once.")
    answer = client.post("/api/deployments/", "- " * 20 + "x", content_type="application/yaml")
    assert answer.json()["detail"] == (
        f"YAML parse error - line 1, column 33: {DEEP_MARK} {MAX_JSON_DEPTH} levels (a "
        "deployment spec is 4 levels deep; send the spec itself).")
    answer = client.post("/api/deployments/", deep_json(5_000), content_type="application/json")
    assert answer.json()["detail"] == (
        f"JSON parse error - {DEEP_MARK} {MAX_JSON_DEPTH} levels (a deployment spec is 4 levels "
        "deep; send the spec itself).")
    assert json.loads(json.dumps(answer.json()))  # a JSON body, not a page
