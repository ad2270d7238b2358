"""The layout's rules, held by the code's own imports and calls: worker -> web -> appliance,
web/deployments below the agent's and the build worker's code, and the agent the only
code that stops an engine container."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _files(folder: str) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py")) if "migrations" not in p.parts]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _importers(folder: str, prefix: str) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in _files(folder)
            if any(m == prefix or m.startswith(prefix + ".") for m in _imports(p))]


def test_appliance_imports_neither_django_nor_the_web() -> None:
    assert _importers("appliance", "django") == []
    assert _importers("appliance", "web") == []
    assert _importers("appliance", "celery") == []


def test_web_never_imports_the_worker_package() -> None:
    assert _importers("web", "worker") == []


def test_the_deployments_app_never_imports_the_agent_or_the_build_worker() -> None:
    assert _importers("web/deployments", "web.agent") == []
    assert _importers("web/deployments", "web.builder") == []
    assert _importers("web/builder", "web.agent") == []


def test_jobs_are_sent_from_the_task_seam_only() -> None:
    senders = [str(p.relative_to(ROOT)) for p in _files("web") + _files("worker")
               if "send_task(" in p.read_text() or ".apply_async(" in p.read_text()]
    assert senders == ["web/tasks.py"]


def _stops_a_container(path: Path) -> bool:
    """A call of EngineRuntime.stop (`<runtime>.stop(identity, ...)`) in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "stop" and "runtime" in ast.unparse(node.func.value)
                .lower()):
            return True
    return False


def test_only_the_agent_stops_an_engine_container() -> None:
    stoppers = [str(p.relative_to(ROOT)) for p in _files("web") + _files("worker")
                if _stops_a_container(p)]
    assert stoppers == ["web/agent/controller.py"]
