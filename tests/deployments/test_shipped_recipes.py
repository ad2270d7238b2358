"""Every shipped recipe and example deploys with zero pre-flight warnings: the spec the
new-deployment form makes from a recipe's defaults, and each examples/*.yaml as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from appliance.engine.recipes import list_recipes
from appliance.engine.spec import read_spec_file
from web.deploy import checks
from web.deploy.forms import DeploymentForm
from web.deployments import services

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _warnings(data: dict[str, Any]) -> list[str]:
    """Warnings, and notes asking to change a key the spec or its recipe itself sets (the
    form once set disable_overlap_schedule and pre-flight asked to remove it each time)."""
    _, findings = checks.deployment_validate(data=data)
    own = {f"engine.{k}" for k in {**services.recipe_load(data["recipe"]).engine_defaults,
                                   **data.get("engine", {})}}
    return [f"[{f.rule}] {f.field}: {f.message} Fix: {f.fix}" for f in findings
            if f.severity != "info" or (f.field in own and f.fix != "nothing to do")]


def _form_spec(recipe: str) -> dict[str, Any]:
    """What the form posts for a recipe when a person fills in only the paths and name."""
    initial = DeploymentForm(recipe=recipe).initial
    post = {k: "" if v is None else v for k, v in initial.items()}
    post.update(name="from-form", model_path="/models/Kimi-K2.6", gpu_ids="0,1,2,3,4,5,6,7",
                tp_size=8, self_check="on")
    if post.get("algorithm") != "NONE":
        post["drafter_path"] = "/models/Kimi-K2.6-DFlash"
    form = DeploymentForm(post, recipe=recipe)
    assert form.is_valid(), form.errors
    return form.to_spec()


def test_there_are_recipes_and_examples_to_check() -> None:
    assert len(list_recipes()) >= 3 and len(EXAMPLES) >= 2


@pytest.mark.parametrize("recipe", list_recipes())
def test_each_recipe_deploys_from_the_form_with_no_warnings(recipe: str) -> None:
    assert _warnings(_form_spec(recipe)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_deploys_with_no_warnings(path: Path, tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    # The secrets an example declares are in the store, as its README asks of a site.
    data = read_spec_file(path)
    for name in data.get("secrets") or []:
        (tmp_path / name).write_text("a-value")
    settings.ENGINE_SECRETS_DIR = str(tmp_path)
    assert _warnings(data) == []
