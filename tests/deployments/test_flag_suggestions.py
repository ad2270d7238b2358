"""A misspelt engine flag gets the flag it surely meant; an unknown one gets no guess."""

from __future__ import annotations

import pytest

from appliance.engine.flags import closest_flag, load_flags
from tests.specs import spec
from web.deploy import checks
from web.deployments import services

pytestmark = pytest.mark.django_db


def _unknown_flag_errors(**changes):  # type: ignore[no-untyped-def]
    with pytest.raises(services.DeploymentInputError) as caught:
        checks.deployment_validate(data=spec(**changes))
    return {field: " ".join(messages) for field, messages in caught.value.errors.items()
            if "[unknown-flag]" in " ".join(messages)}


def test_a_misspelt_flag_in_extra_args_gets_the_flag_it_meant():  # type: ignore[no-untyped-def]
    errors = _unknown_flag_errors(extra_args=["--speculative-num-draft-token", "8"])
    assert "did you mean --speculative-num-draft-tokens?" in errors["extra_args[0]"]


def test_an_unrelated_unknown_flag_gets_no_suggestion():  # type: ignore[no-untyped-def]
    errors = _unknown_flag_errors(extra_args=["--speculative-eagle-mode", "fast"])
    assert "did you mean" not in errors["extra_args[0]"]
    assert "remove it" in errors["extra_args[0]"]


def test_ddtrees_budget_on_a_release_without_ddtree_is_not_called_an_ngram_flag():  # type: ignore[no-untyped-def]
    # The case: 0.5.23 has no DDTree; its ngram SAM budget only shares two words.
    errors = _unknown_flag_errors(recipe="kimi-k2.6-baseline")
    message = errors["engine.speculative_ddtree_budget"]
    assert "has no --speculative-ddtree-budget" in message
    assert "did you mean" not in message and "sam-budget" not in message


@pytest.mark.parametrize(("typed", "meant"), [
    ("--speculative-num-draft-token", "--speculative-num-draft-tokens"),  # cut short
    ("--speculative_num_draft_tokens", "--speculative-num-draft-tokens"),  # snake_case
    ("--tp-sise", "--tp-size"),
    ("--mem-fration-static", "--mem-fraction-static"),
    ("--mem-fraction", "--mem-fraction-static"),  # one word short
    ("--enable-metric", "--enable-metrics"),  # begins two flags, finishes one word of one
    ("--speculative-ddtree-budget", None),  # shares only "speculative" and "budget"
    ("--speculative-sam-budget", None),
    ("--speculative-eagle-mode", None),  # "speculative-eagle-" alone would pass 0.8
    ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),  # one word short of two: the shorter
    ("--speculative-ngram-external", None),  # two words short of several: a guess
    ("--tp", None),  # a stub, not a misspelling
    ("--torch-compile", None),  # two words short of --torch-compile-max-bs
    ("--frobnicate-widgets", None),
])
def test_closest_flag_suggests_only_a_real_close_match(typed, meant):  # type: ignore[no-untyped-def]
    known = load_flags("sglang-0.5.23")
    assert known is not None
    assert closest_flag(typed, known) == meant
