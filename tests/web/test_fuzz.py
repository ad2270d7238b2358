"""Generated input, bounded in time: schemathesis against the OpenAPI schema (every
operation, generated bodies, paths and query strings) and hypothesis on the spec parser,
pre-flight and the web service that runs both. Zero server errors."""

from __future__ import annotations

import string
import unicodedata
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from appliance.engine.flags import load_flags
from appliance.engine.launch import launch_args
from appliance.engine.spec import SpecError, engine_field_names, flag_for, spec_from_dict
from appliance.preflight import run_preflight
from tests.specs import spec
from web.deploy import checks
from web.deploy import services as deploying
from web.deployments.services import DeploymentInputError

EXAMPLES_PER_OPERATION = 60
SPEC_EXAMPLES = 300

def fuzz(examples: int) -> settings:
    """Bounded: a fixed number of examples, no example database, no time limit per example."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

# ------------------------------------------------------------------ spec strategies

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8)
_numbers = st.one_of(st.integers(), st.integers(min_value=10**300, max_value=10**4000),
                     st.floats(allow_nan=True, allow_infinity=True))
_value = st.one_of(_numbers, st.booleans(), st.none(), st.text(max_size=30),
                   st.text(alphabet=string.printable, max_size=8), _json)
_flags = sorted(load_flags("sglang-0.5.23") or []) + [flag_for(f) for f in engine_field_names()]
_arg = st.one_of(st.sampled_from(_flags), st.sampled_from(_flags).map(lambda f: f + "=1e308"),
                 st.text(max_size=16), st.integers().map(str), st.just(" hf_" + "a" * 24))
_env_name = st.one_of(st.sampled_from(["NCCL_DEBUG", "LD_PRELOAD", "PATH", "HF_TOKEN", "x y",
                                       "APPLIANCE_GPU_CHECK"]), st.text(max_size=10))


@st.composite
def specs(draw: Any) -> dict[str, Any]:
    """A valid spec with some keys replaced, removed or added at random."""
    data: dict[str, Any] = spec()
    engine = data["engine"]
    for key in draw(st.lists(st.sampled_from(engine_field_names() + ["bogus"]), max_size=4)):
        engine[key] = draw(_value)
    data["extra_args"] = draw(st.lists(_arg, max_size=8))
    if draw(st.booleans()):
        data["env"] = draw(st.dictionaries(_env_name, _value, max_size=3))
    if draw(st.booleans()):
        data["secrets"] = draw(st.one_of(st.lists(_env_name, max_size=3), _json))
    for key in draw(st.lists(st.sampled_from(["name", "recipe", "gpus", "engine",
                                              "self_check", "other"]), max_size=2)):
        data[key] = draw(st.one_of(_value, st.lists(st.integers(-3, 2**65), max_size=6)))
    return data


@fuzz(SPEC_EXAMPLES)
@given(data=specs())
def test_the_spec_parser_and_preflight_answer_every_input_with_findings_or_field_errors(
        data: dict[str, Any]) -> None:
    try:
        parsed = spec_from_dict(data)
    except SpecError as exc:
        assert exc.errors and all(e.field is not None for e in exc.errors)
        return
    run_preflight(parsed, read_local_configs=False)
    argv = launch_args(parsed).argv
    assert not any(unicodedata.category(ch) == "Cc" for item in argv for ch in item)
    assert sum(len(item) for item in argv) < 200_000


@pytest.mark.django_db
@fuzz(SPEC_EXAMPLES // 3)
@given(data=specs())
def test_the_web_validation_answers_every_input_with_a_field_error_or_a_spec(
        data: dict[str, Any]) -> None:
    try:
        checks.deployment_validate(data=data)
    except DeploymentInputError as exc:
        assert exc.errors


# ------------------------------------------------------------------ schemathesis


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error_in_the_api(operator, token_for) -> None:  # type: ignore[no-untyped-def]
    real = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    raw = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = WSGIHandler()
    headers = {"Authorization": f"Token {token_for(operator)}"}
    sent: list[int] = []
    errors: list[str] = []

    for result in schema.get_all_operations():
        operation = result.ok()

        # Both what the schema allows and what it does not (wrong types, out of range).
        @fuzz(EXAMPLES_PER_OPERATION)
        @given(case=st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                              operation.as_strategy(GenerationMode.NEGATIVE)))
        def call(case: Any) -> None:
            if case.path_parameters and len(sent) % 2:
                case.path_parameters = {k: str(real) for k in case.path_parameters}
            response = case.call(headers=headers)
            sent.append(response.status_code)
            if response.status_code >= 500:
                errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}")

        call()
    print(f"schemathesis: {len(sent)} requests, {len(errors)} server errors")
    assert len(sent) >= 5 * EXAMPLES_PER_OPERATION
    assert not errors, "\n".join(errors[:20])
