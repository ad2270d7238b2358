"""The panel's pages as a person gets them: the new-deployment form's defaults, the list, the
flash after deploying."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.specs import spec
from web.deploy import checks
from web.deploy import services as deploying
from web.deploy.forms import DeploymentForm
from web.deployments import services
from web.deployments.models import Deployment

pytestmark = pytest.mark.django_db

# Shipped recipes are what a fresh install offers; a site's own recipes are the site's to keep.
SHIPPED = ["kimi-k2.6-baseline", "kimi-k2.6-ddtree", "kimi-k2.6-dflash"]
# What the form cannot know and a person types in; everything else is taken as rendered.
TYPED = {"name": "kimi", "model_path": "/models/Kimi-K2.6"}
DRAFTER = "/models/Kimi-K2.6-DFlash"


class _FormValues(HTMLParser):
    """The values a browser would submit for a rendered form, unchanged: inputs' value
    attributes, checked boxes, each select's selected (else first) option, textareas' text."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.scripts: dict[str, str] = {}
        self._select: str | None = None
        self._first_option: str | None = None
        self._textarea: str | None = None
        self._script: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name", "")
        if tag == "input" and name and name != "csrfmiddlewaretoken":
            if a.get("type") != "checkbox":
                self.values[name] = a.get("value", "")
            elif "checked" in a:
                self.values[name] = "on"
        elif tag == "select":
            self._select, self._first_option = name, None
        elif tag == "option" and self._select:
            if self._first_option is None:
                self._first_option = a.get("value", "")
            if "selected" in a:
                self.values[self._select] = a.get("value", "")
        elif tag == "textarea":
            self._textarea = name
            self.values[name] = ""
        elif tag == "script" and a.get("type") == "application/json":
            self._script = a.get("id", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select" and self._select:
            self.values.setdefault(self._select, self._first_option or "")
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data.removeprefix("\n")
        elif self._script:
            self.scripts[self._script] = self.scripts.get(self._script, "") + data


def _rendered(client: Client, recipe: str | None = None) -> _FormValues:
    url = reverse("deployments:new") + (f"?recipe={recipe}" if recipe else "")
    response = client.get(url)
    assert response.status_code == 200
    assert "{#" not in response.content.decode()  # a template comment leaking into the page
    parsed = _FormValues()
    parsed.feed(response.content.decode())
    return parsed


@pytest.fixture
def operator_client(operator) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    return client


def _typed_in(values: dict[str, str]) -> dict[str, str]:
    """The rendered values plus only what a person must type: a name, the model, and the
    drafter when the algorithm drafts."""
    data = {**values, **TYPED}
    if values["algorithm"] != "NONE":
        data["drafter_path"] = DRAFTER
    return data


@pytest.mark.parametrize("recipe", [None, *SHIPPED])
def test_the_form_as_rendered_for_each_recipe_deploys_without_errors(operator_client, recipe):  # type: ignore[no-untyped-def]
    values = _rendered(operator_client, recipe).values
    if recipe is not None:
        assert values["recipe"] == recipe
    form = DeploymentForm(_typed_in(values))
    assert form.is_valid(), form.errors
    try:
        _, findings = checks.deployment_validate(data=form.to_spec())
    except services.DeploymentInputError as exc:
        pytest.fail(f"{values['recipe']} as rendered does not deploy: {exc}")
    assert not [f for f in findings if f.severity == "error"]


def test_the_recipe_picks_the_algorithm_and_its_engine_defaults(operator_client):  # type: ignore[no-untyped-def]
    ddtree = _rendered(operator_client, "kimi-k2.6-ddtree").values
    assert (ddtree["algorithm"], ddtree["block_size"], ddtree["tree_budget"]) == ("DDTREE", "8", "32")
    assert ddtree["attention_backend"] == "fa3"
    dflash = _rendered(operator_client, "kimi-k2.6-dflash").values
    assert (dflash["algorithm"], dflash["block_size"], dflash["tree_budget"]) == ("DFLASH", "8", "")
    baseline = _rendered(operator_client, "kimi-k2.6-baseline").values
    assert (baseline["algorithm"], baseline["block_size"], baseline["tree_budget"]) == ("NONE", "", "")
    # An unknown name is not a path to read: the form starts from the first listed recipe.
    assert _rendered(operator_client, "../../etc/passwd").values["recipe"] == SHIPPED[0]


def test_the_page_embeds_for_its_script_what_the_server_renders_per_recipe(operator_client):  # type: ignore[no-untyped-def]
    embedded: dict[str, dict[str, Any]] = json.loads(
        _rendered(operator_client).scripts["recipe-defaults"])
    assert set(SHIPPED) <= set(embedded)
    for recipe in SHIPPED:
        values = _rendered(operator_client, recipe).values
        for field, value in embedded[recipe].items():
            assert values[field] == ("" if value is None else str(value)), (recipe, field)


def test_the_list_tells_same_named_deployments_apart_by_id_and_utc_creation_time(operator_client):  # type: ignore[no-untyped-def]
    first = deploying.deployment_create(data=spec(), confirm_warnings=True)
    services.deployment_stop(deployment_id=first.pk)  # a served name is one active one's
    second = deploying.deployment_create(data=spec(gpus=[1]), confirm_warnings=True)
    created = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    Deployment.objects.filter(pk=first.pk).update(created_at=created)
    page = operator_client.get(reverse("deployments:list")).content.decode()
    assert "{#" not in page
    for deployment in (first, second):
        assert f'<tr id="deployment-{deployment.pk}">' in page
        assert f">#{deployment.pk}</a>" in page
    assert "2026-03-04 05:06:07 UTC" in page
    assert 'datetime="2026-03-04T05:06:07+00:00"' in page


def test_the_queued_flash_is_tagged_so_the_detail_page_drops_it_when_the_status_moves_on(  # type: ignore[no-untyped-def]
        operator_client):
    values = _rendered(operator_client, "kimi-k2.6-ddtree").values
    data = {**_typed_in(values), "confirm_warnings": "on"}
    response = operator_client.post(reverse("deployments:new"), data, follow=True)
    assert response.status_code == 200, response.content.decode()[:2000]
    page = response.content.decode()
    assert "{#" not in page
    assert 'class="flash success while-queued"' in page or 'class="flash while-queued success"' in page
    # Shown once: the next visit of the page has no flash at all.
    assert 'class="flash' not in operator_client.get(response.request["PATH_INFO"]).content.decode()


def test_a_fixed_image_hides_the_rebuild_choice_and_the_form_still_deploys(  # type: ignore[no-untyped-def]
        operator_client, settings):
    assert "Rebuild the engine image" in operator_client.get(reverse("deployments:new")).content.decode()
    settings.ENGINE_IMAGE = "engine:fixed"  # nothing is built: a rebuild cannot apply
    page = operator_client.get(reverse("deployments:new")).content.decode()
    assert "Rebuild the engine image" not in page and 'name="rebuild_image"' not in page
    values = _rendered(operator_client, "kimi-k2.6-ddtree").values
    data = {**_typed_in(values), "confirm_warnings": "on", "rebuild_image": "on"}
    response = operator_client.post(reverse("deployments:new"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Deployment.objects.get().rebuild_image is False


def test_a_stopped_deployments_page_shows_no_live_figures(operator_client):  # type: ignore[no-untyped-def]
    from tests.rows import ready

    deployment = ready()
    live = operator_client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "Live metrics" in live and "waiting for the first scrape" in live
    services.deployment_stop(deployment_id=deployment.pk)
    services.deployment_mark_stopped(deployment_id=deployment.pk)
    page = operator_client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "Live metrics" not in page
    assert "(as last seen, before the engine stopped; not live)" in page
    assert "the engine is stopped: no live figures" in page


def test_the_detail_page_says_which_tune_holds_the_deployment(operator_client):  # type: ignore[no-untyped-def]
    row = deploying.deployment_create(data=spec(), confirm_warnings=True)
    url = reverse("deployments:detail", args=[row.pk])
    assert 'id="tune-hold"' not in operator_client.get(url).content.decode()
    Deployment.objects.filter(pk=row.pk).update(tune_hold={
        "tune": 7, "holds": "the deployment (GPUs 0)", "until": "2026-01-01T00:00:00",
        "text": "the deployment is out of service for Tune #7"})
    page = operator_client.get(url).content.decode()
    assert '<p id="tune-hold" class="flash warning"><a href="/benchmarks/tunes/7/">' in page
    assert "The deployment is out of service for Tune #7" in page
