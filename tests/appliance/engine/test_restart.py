"""The spec's restart policy (appliance/engine/restart.py): opt-in, validated field by field,
a wait of 10 s doubling up to 5 minutes."""

from __future__ import annotations

import pytest

from appliance.engine.restart import backoff_s
from appliance.engine.spec import SpecError, spec_from_dict, spec_to_dict
from tests.specs import spec


def test_it_is_off_unless_a_spec_asks_and_round_trips_when_it_does() -> None:
    assert not spec_from_dict(spec()).restart.on_failure
    asked = spec_from_dict(spec(restart={"policy": "on-failure", "max_restarts": 3}))
    assert asked.restart.on_failure and asked.restart.max_restarts == 3
    assert spec_to_dict(asked)["restart"] == {"policy": "on-failure", "max_restarts": 3}


@pytest.mark.parametrize(("value", "field"), [
    ({"policy": "always"}, "restart.policy"),
    ({"policy": "on-failure", "max_restarts": -1}, "restart.max_restarts"),
    ({"policy": "on-failure", "max_restarts": True}, "restart.max_restarts"),
    ({"polcy": "on-failure"}, "restart.polcy"),
    ("on-failure", "restart"),
])
def test_a_bad_policy_is_an_error_naming_its_field_and_the_fix(value: object, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_dict(spec(restart=value))
    error = next(e for e in caught.value.errors if e.field == field)
    assert "restart:" in error.fix or "remove it" in error.fix


def test_the_wait_doubles_from_ten_seconds_and_stops_at_five_minutes() -> None:
    assert [backoff_s(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff_s(10_000) == 300
