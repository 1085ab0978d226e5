"""The packages' import graph has no cycles.

The graph is built from the source with :mod:`ast`, so it sees every import: at module
level, inside functions (lazy imports) and under ``TYPE_CHECKING``. A cycle of lazy
imports still ties the modules together: neither can be understood or moved alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.cli import REPO_ROOT

PACKAGES = ("jobs", "runner", "workloads")


def module_files(root: Path = REPO_ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name → source file, for every module of ``packages`` under ``root``."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name an ``import`` or ``from … import`` in ``tree`` may load, resolved to absolute form."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package_parts = module.split(".") if is_package else module.split(".")[:-1]
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            # ``from package import name`` may load the submodule ``package.name``.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the modules of ``modules`` it imports (the most specific one each import names)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: set[str] = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = lowlink[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _one_loop(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A concrete import loop through the first module of ``component``, for the failure message."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        following = sorted(graph[path[-1]] & members)
        if start in following and len(path) > 1:
            return path + [start]
        step = next((m for m in following if m not in seen), following[0])
        if step in seen:
            return path[path.index(step):] + [step]
        path.append(step)
        seen.add(step)


def test_the_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg.a import thing\n")
    graph = import_graph(module_files(tmp_path, ("pkg",)))
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_import_cycles_in_the_packages():
    graph = import_graph(module_files())
    found = cycles(graph)
    report = "\n".join(f"  {' -> '.join(_one_loop(component, graph))}   (modules: {', '.join(component)})"
                       for component in found)
    assert not found, f"import cycles in {', '.join(PACKAGES)}:\n{report}"


ARCHITECTURE_DOC = REPO_ROOT / "docs" / "architecture.md"
# Left out of the picture: every package imports them (the doc says so); ``runner`` itself is only a docstring,
# reached by ``from runner import local``.
UNDRAWN_TARGETS = {"jobs", "runner.errors", "runner"}


def package_of(module: str) -> str:
    """The package a module is drawn as: a sub-package of runner or workloads, else its top-level package."""
    parts = module.split(".")
    if module == "runner.errors":
        return module
    if parts[0] in ("runner", "workloads") and len(parts) > 2:
        return ".".join(parts[:2])
    if parts[0] in ("runner", "workloads") and len(parts) == 2 and (REPO_ROOT / parts[0] / parts[1]).is_dir():
        return module
    return parts[0]


def drawn_arrows() -> set[tuple[str, str]]:
    """The ``A --> B`` arrows of the picture in docs/architecture.md."""
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    graph = text.split("<!-- architecture:graph -->")[1].split("<!-- /architecture:graph -->")[0]
    return {(a, b) for a, b in re.findall(r"^\s*([\w.]+)\s*-->\s*([\w.]+)\s*$", graph, re.M)}


def test_the_architecture_picture_draws_every_arrow_and_no_other():
    graph = import_graph(module_files())
    actual = {(package_of(module), package_of(target)) for module, targets in graph.items() for target in targets}
    actual = {(a, b) for a, b in actual if a != b and b not in UNDRAWN_TARGETS and not a.startswith("jobs")}
    drawn = drawn_arrows()
    assert actual == drawn, (f"in the code, not drawn: {sorted(actual - drawn)}; "
                             f"drawn, not in the code: {sorted(drawn - actual)}")


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(REPO_ROOT)): lines for path in module_files().values()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}
