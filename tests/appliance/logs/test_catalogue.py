"""The one failure catalogue (appliance/logs/catalogue.py): the engine's causes and the
appliance's own in one id space, and no diagnosis made or stored outside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from appliance.logs.appliance_causes import APPLIANCE_CAUSES, start_failure
from appliance.logs.catalogue import CATALOGUE, UncataloguedCause, catalogue_rows, catalogued
from appliance.logs.cause import Diagnosis
from appliance.logs.causes import CAUSES

ROOT = Path(__file__).resolve().parents[3]
CODE = [path for folder in ("appliance", "web", "worker")
        for path in sorted((ROOT / folder).rglob("*.py")) if "migrations" not in path.parts]


def _calls_to(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == name
                 or getattr(node.func, "attr", None) == name)]


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_the_catalogue_holds_the_engine_causes_and_the_appliance_causes_once_each() -> None:
    appliance_ids = [cause.id for cause in APPLIANCE_CAUSES]
    assert len(appliance_ids) == len(set(appliance_ids))
    assert not set(appliance_ids) & set(CAUSES)
    assert set(CATALOGUE) == set(CAUSES) | set(appliance_ids)
    assert {"image-build-failed", "model-not-ready", "no-gpu-runtime", "engine-exited",
            "unknown-error"} <= set(CATALOGUE)


def test_a_port_taken_at_the_start_is_the_engine_causes_port_in_use() -> None:
    found = start_failure("Bind for 127.0.0.1:30000 failed: port is already allocated")
    assert found.cause == "port-in-use"
    assert (found.summary, found.fix) == (CAUSES["port-in-use"].summary,
                                          CAUSES["port-in-use"].fix)


def test_catalogued_refuses_a_cause_the_catalogue_does_not_have() -> None:
    with pytest.raises(UncataloguedCause, match="'oom-load' is not in the failure catalogue"):
        catalogued(Diagnosis("oom-load", "out of memory", "use more GPUs"))
    known = CATALOGUE["engine-exited"].worded(summary="exited with code 1")
    assert catalogued(known) is known


def test_the_listing_names_every_cause_with_its_part() -> None:
    rows = catalogue_rows()
    assert sorted(row["id"] for row in rows) == sorted(CATALOGUE)
    parts = {row["id"]: row["part"] for row in rows}
    assert parts["image-build-failed"] == "appliance" and parts["cuda-oom-capture"] == "engine"


def test_no_code_makes_a_diagnosis_from_a_cause_id_written_in_it() -> None:
    """A diagnosis comes from a Cause (cause.diagnosis, cause.worded, or a refiner passing
    cause.id): a string id written at the call site could name a cause that is not listed."""
    found = []
    for path in CODE:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for call in _calls_to(tree, "Diagnosis"):
            first = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "cause"), None)
            if _literal(first):
                found.append(f"{path.relative_to(ROOT)}:{call.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and any(
                    _literal(k) and k.value == "cause" and _literal(v)  # type: ignore[union-attr]
                    for k, v in zip(node.keys, node.values, strict=True)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} (a dict)")
    assert found == []


def test_every_cause_id_the_code_looks_up_is_in_the_catalogue() -> None:
    named = set()
    for path in CODE:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in (
                    "CAUSES", "CATALOGUE", "ENGINE_CAUSES") and _literal(node.slice)):
                named.add(node.slice.value)  # type: ignore[attr-defined]
    assert named and named <= set(CATALOGUE)
