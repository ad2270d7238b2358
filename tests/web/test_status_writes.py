"""A deployment's status has one writer: services/lifecycle.py's _transition, which applies
appliance.lifecycle's table. Any other write of it in the product's code fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from appliance import lifecycle
from appliance.lifecycle import AGENT_OWNED, Process, Status, sources_of
from web.deployments.models import (
    ACTIVE_STATUSES,
    RUNNING_STATUSES,
    TERMINAL_STATUSES,
    DeploymentStatus,
)
from web.deployments.services.lifecycle import ADVANCE

ROOT = Path(__file__).resolve().parents[2]
WRITER = ("web/deployments/services/lifecycle.py", "_transition")
WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create"}


def _receiver(call: ast.Call) -> str:
    return ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""


def _is_status_write(node: ast.AST) -> bool:
    """A Deployment row's status set by a query, a save of the field, or an assignment."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        keywords = {k.arg for k in node.keywords}
        if node.func.attr in WRITES and "status" in keywords:
            return "Deployment" in _receiver(node)
        if node.func.attr in {"save", "bulk_update"}:
            fields = [k.value for k in node.keywords if k.arg == "update_fields"] + node.args[1:]
            return any("status" in ast.unparse(f) for f in fields)
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Attribute) and t.attr == "status"
                   and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                   for t in targets)
    return False


def status_writes(source: str, path: str) -> list[str]:
    """Every status write in one file, as "path:line in function", the writer's left out."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else function
            if _is_status_write(child) and (path, inner) != WRITER:
                found.append(f"{path}:{child.lineno} in {inner or 'the module'}")
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def _product_files() -> list[Path]:
    return [p for folder in ("web", "worker") for p in sorted((ROOT / folder).rglob("*.py"))
            if "migrations" not in p.parts]


def test_nothing_but_the_transition_function_writes_a_deployments_status() -> None:
    found = [w for p in _product_files()
             for w in status_writes(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "write status through services/lifecycle.py, not here: " + str(found)


def test_the_scan_sees_the_writer_itself() -> None:
    # Not vacuous: the one allowed write is there and would be found outside _transition.
    source = (ROOT / WRITER[0]).read_text()
    assert status_writes(source, "elsewhere.py") != []
    assert status_writes(source, WRITER[0]) == []


def test_it_catches_a_planted_raw_status_update() -> None:
    planted = ("def deployment_reset(pk):\n"
               "    Deployment.objects.filter(pk=pk).update(status='queued')\n")
    assert status_writes(planted, "web/deployments/services/lifecycle.py") == [
        "web/deployments/services/lifecycle.py:2 in deployment_reset"]


def test_it_catches_an_assignment_and_a_save_of_the_status_field() -> None:
    planted = ("def f(row):\n"
               "    row.status = 'ready'\n"
               "    row.save(update_fields=['status', 'updated_at'])\n"
               "    Deployment.objects.create(name='x', status='ready')\n")
    assert len(status_writes(planted, "web/x.py")) == 3


def test_it_leaves_other_models_statuses_and_a_followers_view_alone() -> None:
    other = ("def f(pk):\n"
             "    BenchmarkRun.objects.filter(pk=pk).update(status='cancelled')\n"
             "    self.status = 'ready'\n")
    assert status_writes(other, "web/x.py") == []


def test_djangos_choices_are_the_lifecycles_statuses() -> None:
    assert [(s.name, s.value) for s in DeploymentStatus] == [(s.name, s.value) for s in Status]
    assert ACTIVE_STATUSES == lifecycle.ACTIVE and TERMINAL_STATUSES == lifecycle.TERMINAL
    assert RUNNING_STATUSES == lifecycle.RUNNING


def test_the_agent_owns_what_it_moves_from_and_advances_the_engine_phases() -> None:
    assert lifecycle.RUNNING | {Status.STOPPING} == AGENT_OWNED
    assert lifecycle.ENGINE_PHASES == (Status.STARTING, Status.CHECKING, Status.LOADING,
                                       Status.CAPTURING, Status.READY)
    assert set(ADVANCE) == set(lifecycle.ENGINE_PHASES[1:])
    for index, phase in enumerate(lifecycle.ENGINE_PHASES[1:], start=1):
        assert sources_of(phase, by=Process.AGENT) == set(lifecycle.ENGINE_PHASES[:index])


def test_the_agent_marks_a_stopping_deployment_stopped_and_the_builder_only_a_build() -> None:
    """The agent ends a stop once the engine is gone; the build worker ends only the stop
    of a build whose run never started an engine (deployment_mark_build_stopped matches an
    empty start token): no agent was ever handed anything to stop or report."""
    assert sources_of(Status.STOPPED, by=Process.AGENT) == {Status.STOPPING}
    assert sources_of(Status.STOPPED, by=Process.WEB) == {Status.QUEUED}
    assert sources_of(Status.STOPPED, by=Process.BUILDER) == {Status.STOPPING}
    assert sources_of(Status.STOPPED, by=Process.ROLLER) == set()


def test_every_status_is_reached_and_every_active_one_can_end() -> None:
    targets = {m.target for m in lifecycle.TRANSITIONS}
    assert targets == set(Status)  # queued too: the restart
    ends = {s for m in lifecycle.TRANSITIONS if m.target in lifecycle.TERMINAL for s in m.sources}
    assert ends == set(lifecycle.ACTIVE)
