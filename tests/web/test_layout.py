"""The layout's rules, held by the code's own imports and calls: worker -> web -> appliance,
web/deployments below the agent's and the build worker's code and taking nothing from web's
other apps (the ground they stand on), no circle of modules, and the agent the only code that
stops an engine container."""

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


def test_the_deployments_app_never_imports_the_build_worker_or_the_api() -> None:
    assert _importers("web/deployments", "web.builder") == []
    assert _importers("web/deployments", "web.api") == []


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
    # One agent program on every host: no second container stop in the tree.
    stoppers = [str(p.relative_to(ROOT)) for p in
                _files("appliance") + _files("web") + _files("worker") if _stops_a_container(p)]
    assert stoppers == ["appliance/runtime/remote_agent.py"]


# ------------------------------------------------------------------ circles and web's floors

PACKAGES = ("appliance", "web", "worker")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict[str, Path]:
    return {_module_of(p): p for top in PACKAGES for p in _files(top)}


def _targets(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports, anywhere in it: each import names the most
    specific module it reaches (`from web.x import y` is web.x.y where y is a module)."""
    here = _module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.add(name)
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _project_modules()
    return {name: _targets(path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return circles


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = _import_graph()
    assert "web.fleet.placement" in graph["web.deploy.services"]
    assert _circles(graph) == []


# web/deployments is the ground of web's apps: what spans them (deploying a spec, the pages
# that show a deployment with the gateway's and the store's facts) is web/deploy's.
HIGHER_APPS = ("web.api", "web.benchmarks", "web.deploy", "web.fleet", "web.gateway",
               "web.store", "web.accounts")


def test_the_deployments_app_takes_nothing_from_higher_apps() -> None:
    graph = _import_graph()
    upward = {(str(_project_modules()[name].relative_to(ROOT)), target)
              for name, targets in graph.items() if name.startswith("web.deployments.")
              for target in targets if ".".join(target.split(".")[:2]) in HIGHER_APPS}
    assert upward == set(), sorted(upward)
