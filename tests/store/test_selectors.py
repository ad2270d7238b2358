"""The store's reads: an entry by engine path, and the deployments that use an entry."""

from __future__ import annotations

import pytest

from web.deployments.models import Deployment, DeploymentStatus
from web.store import selectors
from web.store.models import ModelEntry

pytestmark = pytest.mark.django_db


def _deployment(name: str, status: str, **engine: str) -> Deployment:
    return Deployment.objects.create(name=name, spec={"engine": engine}, recipe="r",
                                     algorithm="DFLASH", status=status)


def test_the_deployments_using_an_entry_as_model_or_drafter(settings) -> None:  # type: ignore[no-untyped-def]
    settings.MODEL_ROOTS = ["/a"]
    kimi = ModelEntry.objects.create(root="/a", relative_path="Kimi-K2.6", state="ready")
    serving = _deployment("serving", DeploymentStatus.READY, model_path="/models/Kimi-K2.6")
    drafting = _deployment("drafting", DeploymentStatus.STOPPED, model_path="/models/Other",
                           speculative_draft_model_path="/models/Kimi-K2.6")
    _deployment("unrelated", DeploymentStatus.READY, model_path="/models/Kimi-K2.6-DFlash")
    assert set(selectors.model_entry_deployments(entry=kimi)) == {serving, drafting}
    assert list(selectors.model_entry_deployments(entry=kimi, active_only=True)) == [serving]


def test_a_folder_in_two_roots_is_the_first_roots(settings) -> None:  # type: ignore[no-untyped-def]
    settings.MODEL_ROOTS = ["/fast", "/slow"]
    ModelEntry.objects.create(root="/slow", relative_path="m", state="ready")
    fast = ModelEntry.objects.create(root="/fast", relative_path="m", state="partial")
    assert selectors.model_entry_for_path(engine_path="/models/m") == fast
    assert selectors.model_entry_for_path(engine_path="/models/none") is None
    assert selectors.model_entry_for_path(engine_path="/models") is None
