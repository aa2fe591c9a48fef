"""The import structure the design asks for: two floors inside ``fedreg_app`` and no
import circle anywhere in the project's packages."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedreg_app", "clients", "strategies")
#: What the algorithms stand on: must not know the algorithms or the apps.
LOWER_FLOOR = {
    "fedreg_app.config", "fedreg_app.data", "fedreg_app.models", "fedreg_app.training",
    "fedreg_app.persist", "fedreg_app.protocol", "fedreg_app.records", "fedreg_app.metrics",
    "fedreg_app.checkpoint", "fedreg_app.partitioners", "fedreg_app.partition_map",
    "fedreg_app.seeds", "fedreg_app.client_state", "fedreg_app.overrides",
    "fedreg_app.convert", "fedreg_app.tensorboard_log", "fedreg_app.privacy",
}  # fmt: skip


def project_imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file, late imports too)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (PROJECT / package).glob("*.py"):
            module = f"{package}.{path.stem}"
            names: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    base = node.module
                    names.add(base)
                    names.update(f"{base}.{alias.name}" for alias in node.names)
                elif isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
            graph[module] = {n for n in names if n.split(".")[0] in PACKAGES}
    return {m: {n for n in deps if n in graph and n != m} for m, deps in graph.items()}


def test_the_lower_floor_imports_no_algorithm_and_no_app() -> None:
    graph = project_imports()
    assert set(graph) >= LOWER_FLOOR
    for module in LOWER_FLOOR:
        above = sorted(d for d in graph[module] if d not in LOWER_FLOOR)
        assert not above, f"{module} imports {above}"


def test_there_is_no_import_circle() -> None:
    graph = project_imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dependency in sorted(graph[module]):
            if state.get(dependency) == 1:
                circle = path[path.index(dependency) :] + [dependency]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if dependency not in state:
                visit(dependency, [*path, dependency])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
