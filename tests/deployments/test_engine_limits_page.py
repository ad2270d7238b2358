"""The deployment page says what its engine refuses, by its engine build (the recipe's SGLang
source, its lock, its image), not by its algorithm's name (web/deployments/engine_limits.py,
appliance/engine/refusals.py)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.specs import spec
from web.deployments.models import Deployment

pytestmark = pytest.mark.django_db


def _make(name: str, *, recipe: str, algorithm: str, **changes: Any) -> Deployment:
    data = spec(name=name, recipe=recipe, engine__speculative_algorithm=algorithm, **changes)
    return Deployment.objects.create(name=name, spec=data, recipe=recipe, algorithm=algorithm,
                                     gpus=data["gpus"], image=f"appliance-engine:{name}-abc")


def _card(client: Client, d: Deployment) -> str:
    page = client.get(f"/deployments/{d.pk}/").content.decode()
    found = re.search(r'<section class="card" id="engine-limits".*?</section>', page, re.S)
    assert found, "the page has the engine's limits"
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(0)))


def test_ddtree_on_433c58ed7_refuses_log_probs_and_grammar_as_recorded(operator) -> None:  # type: ignore[no-untyped-def]
    d = _make("kimi-ddtree", recipe="kimi-k2.6-ddtree", algorithm="DDTREE",
              companion="kimi-base")
    client = Client()
    client.force_login(operator)
    card = _card(client, d)
    assert "Engine build: SGLang 433c58ed7" in card
    assert "lock kimi-k2.6-ddtree.lock.txt" in card and "image appliance-engine:kimi-ddtree-abc" in card
    assert "under DDTREE cannot follow a grammar (JSON mode, a JSON schema, a required tool " \
        "call) or return log-probs" in card
    assert "to the companion 'kimi-base'" in card
    assert "“DFLASH speculative decoding does not support return_logprob yet.”" in card
    assert "Recorded on the real engine: tests/fixtures/real-engine/433c58ed7/refusals_" in card


def test_dflash_on_0_5_23_serves_them_and_says_it_is_a_source_reading(operator) -> None:  # type: ignore[no-untyped-def]
    d = _make("kimi-dflash", recipe="kimi-k2.6-dflash", algorithm="DFLASH")
    client = Client()
    client.force_login(operator)
    card = _card(client, d)
    assert "Engine build: SGLang 0.5.23 (PyPI)" in card and "lock sglang-0.5.23.lock.txt" in card
    assert "under DFLASH serves log-probs and grammar itself" in card
    assert "does not support" not in card
    assert "From a source reading, not a recording:" in card
    assert "validate_dflash_request" in card


def test_a_build_not_in_the_table_says_so_and_what_the_gateway_does(
        operator, tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.RECIPES_DIR = str(tmp_path)
    (tmp_path / "site-other.yaml").write_text(
        "name: site-other\nbase_image: x\nsglang:\n  git: https://example.invalid/sglang\n"
        f"  ref: {'ab12' * 10}\npatches: []\n")
    d = _make("other", recipe="site-other", algorithm="DFLASH")
    client = Client()
    client.force_login(operator)
    card = _card(client, d)
    assert "What SGLang ab12ab12a refuses under DFLASH is not recorded" in card
    assert "passes such requests to the engine" in card
