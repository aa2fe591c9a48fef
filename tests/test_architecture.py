"""The floors of the code, as the folders show them: the core the algorithms stand on
(``fedreg_app.core``), the algorithms (``strategies``, ``clients``), the Flower app
(``fedreg_app``) and the research tools (``fedreg_tools``). Each floor imports only from
its own floor or below, and there is no import circle anywhere."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedreg_app", "clients", "strategies", "fedreg_tools")


def floor(module: str) -> int:
    """0 core, 1 algorithms, 2 app, 3 tools."""
    if module.startswith("fedreg_app.core"):
        return 0
    if module.split(".")[0] in ("strategies", "clients"):
        return 1
    if module.startswith("fedreg_app"):
        return 2
    return 3


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the project's packages."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (PROJECT / package).rglob("*.py"):
            parts = path.relative_to(PROJECT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def project_imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file, late imports too)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        graph[module] = {n for n in names if n in files and n != module}
    return graph


def test_the_core_is_a_package_of_its_own_with_the_modules_the_algorithms_use() -> None:
    graph = project_imports()
    used_by_algorithms = {d for m, deps in graph.items() if floor(m) == 1 for d in deps}
    outside_the_algorithms = {d for d in used_by_algorithms if floor(d) != 1}
    assert outside_the_algorithms
    assert all(d.startswith("fedreg_app.core") for d in outside_the_algorithms)


def test_each_floor_imports_only_from_its_floor_or_below() -> None:
    graph = project_imports()
    upward = sorted(
        f"{module} -> {dependency}"
        for module, deps in graph.items()
        for dependency in deps
        if floor(dependency) > floor(module)
    )
    assert not upward, upward


def test_the_tools_never_travel_in_the_fab() -> None:
    app = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    roots = {pattern.split("/")[0] for pattern in app["fab-include"]}
    assert roots == {"fedreg_app", "strategies", "clients"}
    for component in app["components"].values():
        assert floor(component.split(":")[0]) == 2


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


def test_the_client_app_builds_no_strategy() -> None:
    """What a client needs of its algorithm's server code (the global model's parts, the
    entries a reply carries, the extra modules) is class-level: the ClientApp never
    constructs a strategy."""
    tree = ast.parse((PROJECT / "fedreg_app" / "client_app.py").read_text())
    calls = [
        ast.unparse(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("strategy")
    ]
    assert calls == []
