"""The engine is launched with --served-model-name: the spec's, else the deployment's name."""

from __future__ import annotations

import pytest

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.specs import spec
from web.deployments.models import Deployment
from web.deployments.services.served_names import served_model_name


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_it_defaults_to_the_deployments_name() -> None:
    argv = launch_args(spec_from_dict(spec(name="kimi-ddtree"))).argv
    assert flag(argv, "--served-model-name") == "kimi-ddtree"
    assert argv.count("--served-model-name") == 1


def test_it_takes_the_specs_served_model_name() -> None:
    argv = launch_args(spec_from_dict(spec(engine__served_model_name="kimi-chat"))).argv
    assert flag(argv, "--served-model-name") == "kimi-chat"


@pytest.mark.django_db
def test_the_gateway_names_the_model_the_same_way() -> None:
    plain = Deployment.objects.create(name="plain", spec=spec(name="plain"), recipe="r",
                                      algorithm="DDTREE")
    named = Deployment.objects.create(name="x", spec=spec(engine__served_model_name="kimi"),
                                      recipe="r", algorithm="DDTREE")
    assert served_model_name(deployment=plain) == "plain"
    assert served_model_name(deployment=named) == "kimi"
