"""The code has the shape docs/architecture.md says it has, and its import graph has no cycles.

The graph is built from the source with :mod:`ast`, so it sees every import: at module
level, inside functions (lazy imports) and under ``TYPE_CHECKING``. A cycle of lazy
imports still ties the modules together: neither can be understood or moved alone.

What is checked is concepts, not sizes: the picture draws every package and every arrow
between them and no other, and the "Where to look" table names only packages and files
that exist. A module is split when it holds two ideas, never to meet a line count.

The tests keep a shape too: a module named ``test_<feature>_cluster.py`` holds exactly the tests that need a
real cluster, so a feature's tests are found by its name and their tier by the suffix.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.cli import REPO_ROOT

PACKAGES = ("rayjobs_agent", "jobs", "runner", "workloads")


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
# Left out of the picture when a package outside ``jobs`` imports them: every package may (the doc says so).
# (``runner.errors``: what can go wrong and each exit code; ``runner.reporter``: the one writer of ``rayjobs:`` lines;
# ``runner.backoff``: the retries and deadlines of every request the client and a local cluster's checks send.)
# ``runner`` itself is only a docstring, reached by ``from runner import local``. What ``jobs`` and
# ``jobs.infra`` import is drawn, so that an import from ``jobs`` into another package shows. The agent,
# at the bottom of the house, may be imported by every package: those arrows are not drawn either.
UNDRAWN_TARGETS = {"rayjobs_agent", "jobs", "jobs.infra", "runner.errors", "runner.reporter", "runner.backoff", "runner"}
# Modules drawn as packages of their own (the doc names them in words instead).
UNDRAWN_PACKAGES = {"runner.errors", "runner.reporter", "runner.backoff"}
# Packages whose sub-packages are drawn apart.
SPLIT_PACKAGES = ("rayjobs_agent", "jobs", "runner", "workloads")


def package_of(module: str) -> str:
    """The package a module is drawn as: a sub-package of jobs, runner or workloads, else its top-level package."""
    parts = module.split(".")
    if module in UNDRAWN_PACKAGES:
        return module
    if parts[0] in SPLIT_PACKAGES and len(parts) > 2:
        return ".".join(parts[:2])
    if parts[0] in SPLIT_PACKAGES and len(parts) == 2 and (REPO_ROOT / parts[0] / parts[1]).is_dir():
        return module
    return parts[0]


def _doc_section(start_marker: str, end_marker: str) -> str:
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    return text.split(start_marker, 1)[1].split(end_marker, 1)[0]


def drawn_arrows() -> set[tuple[str, str]]:
    """The ``A --> B`` arrows of the picture in docs/architecture.md."""
    graph = _doc_section("<!-- architecture:graph -->", "<!-- /architecture:graph -->")
    return {(a, b) for a, b in re.findall(r"^\s*([\w.]+)\s*-->\s*([\w.]+)\s*$", graph, re.M)}


def drawn_packages() -> set[str]:
    """Every package the picture shows: the ends of its arrows, its subgraphs and its lone nodes."""
    graph = _doc_section("<!-- architecture:graph -->", "<!-- /architecture:graph -->")
    shown = {name for arrow in drawn_arrows() for name in arrow}
    shown |= set(re.findall(r"^\s*subgraph\s+([\w.]+)\s*$", graph, re.M))
    shown |= set(re.findall(r"^\s*([\w.]+)\s*$", graph, re.M)) - {"end"}
    return shown


def code_packages() -> set[str]:
    """Every package of the code, as the picture draws them."""
    return {package_of(module) for module in module_files()} - UNDRAWN_PACKAGES


def test_the_architecture_picture_draws_every_arrow_and_no_other():
    graph = import_graph(module_files())
    actual = {(package_of(module), package_of(target)) for module, targets in graph.items() for target in targets}
    actual = {(a, b) for a, b in actual
              if a != b and (b not in UNDRAWN_TARGETS or (a.partition(".")[0] == "jobs" and b != "rayjobs_agent"))}
    drawn = drawn_arrows()
    assert actual == drawn, (f"in the code, not drawn: {sorted(actual - drawn)}; "
                             f"drawn, not in the code: {sorted(drawn - actual)}")


def test_the_architecture_picture_shows_every_package_and_no_other():
    actual, drawn = code_packages(), drawn_packages()
    assert actual == drawn, (f"in the code, not drawn: {sorted(actual - drawn)}; "
                             f"drawn, not in the code: {sorted(drawn - actual)}")


# The floors of the house, lowest first: a module imports only from its own floor or those below. ``runner`` and
# ``workloads`` stand side by side on the top floor and never import each other.
FLOORS = (("rayjobs_agent",), ("jobs.infra",), ("jobs",), ("runner", "workloads"))


def floor_of(module: str) -> int:
    """The floor a module stands on (0 is the ground: the agent beside every job)."""
    for level, prefixes in reversed(list(enumerate(FLOORS))):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return level
    raise AssertionError(f"{module} stands on no floor")


def test_no_module_imports_from_a_floor_above_its_own_nor_runner_and_workloads_from_each_other():
    graph = import_graph(module_files())
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                    if floor_of(target) > floor_of(module))
    across = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                    if {module.partition(".")[0], target.partition(".")[0]} == {"runner", "workloads"})
    assert upward == [] and across == [], f"imports from a higher floor: {upward}; across the top floor: {across}"


def test_the_floor_check_sees_an_import_that_runs_up(tmp_path):
    for name, text in {"rayjobs_agent/__init__.py": "", "rayjobs_agent/a.py": "from jobs import b\n",
                       "jobs/__init__.py": "", "jobs/b.py": "import rayjobs_agent.a\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(module_files(tmp_path, ("rayjobs_agent", "jobs")))
    assert sorted((module, target) for module, targets in graph.items() for target in targets
                  if floor_of(target) > floor_of(module)) == [("rayjobs_agent.a", "jobs"), ("rayjobs_agent.a", "jobs.b")]


# What ``jobs.infra`` may use of ``jobs``: storage locations, until they move into ``jobs.infra`` themselves.
INFRA_READS_FROM_JOBS: set[str] = set()


def test_jobs_infra_leans_on_nothing_that_says_what_a_job_is():
    graph = import_graph(module_files())
    reached = {target for module, targets in graph.items() if module.startswith("jobs.infra")
               for target in targets if package_of(target) == "jobs" and target != "jobs"}
    assert reached <= INFRA_READS_FROM_JOBS, (
        f"jobs.infra imports {sorted(reached - INFRA_READS_FROM_JOBS)}: what every side uses to reach Ray, "
        "storage and disk must not depend on the spec's concepts")

def where_to_look_rows() -> list[tuple[list[str], list[str]]]:
    """The "Where to look" table: for each row, the packages it names and the files and folders it starts at."""
    table = _doc_section("## Where to look", "\n## ")
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or set(cells[1]) <= set("-: ") or cells[1] == "package":
            continue
        packages = re.findall(r"`([\w.]+)`", cells[1])
        paths = [name for name in re.findall(r"`([^`]+)`", cells[2]) if re.fullmatch(r"[\w./-]+(\.py|/)", name)]
        rows.append((packages, paths))
    return rows


def missing_table_paths(rows: list[tuple[list[str], list[str]]], root: Path = REPO_ROOT) -> list[str]:
    """The table's names that do not exist: a package that is not one, a path found under no folder it may mean.

    A path with a top-level folder is read from the repository's root; a shorter one from a package its
    row names, or from a folder the row named before it (``runner/records/`` (``store.py``, …)).
    """
    missing = []
    for packages, paths in rows:
        package_dirs = [root / package.replace(".", "/") for package in packages]
        missing += [f"package {package}" for package, folder in zip(packages, package_dirs)
                    if not (folder / "__init__.py").is_file()]
        bases = [root, *package_dirs]
        for path in paths:
            found = next((base / path for base in bases if (base / path).exists()), None)
            if found is None:
                missing.append(f"{path} (row of {', '.join(packages)})")
                continue
            bases.append(found if found.is_dir() else found.parent)
    return missing


def test_the_table_checker_reads_paths_from_the_root_the_rows_packages_and_earlier_folders(tmp_path):
    for name in ("pkg/sub/a.py", "pkg/sub/deep/b.py", "pkg/__init__.py", "pkg/sub/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    rows = [(["pkg.sub"], ["a.py", "pkg/sub/deep/", "b.py"]), (["pkg"], ["sub/a.py", "b.py"]), (["pkg.gone"], [])]
    assert missing_table_paths(rows, tmp_path) == ["b.py (row of pkg)", "package pkg.gone"]


def test_the_where_to_look_table_names_only_what_exists():
    rows = where_to_look_rows()
    assert len(rows) > 10, "the 'Where to look' table was not found in docs/architecture.md"
    assert missing_table_paths(rows) == []


# Not a size target: a module is split when it holds two concepts, and code is never moved to pass this.
# It stays as a tripwire, set well above any module today, for a file that grew several ideas unnoticed.
SANITY_LINE_CAP = 600


def test_no_module_has_grown_past_the_sanity_cap():
    long = {str(path.relative_to(REPO_ROOT)): lines for path in module_files().values()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > SANITY_LINE_CAP}
    assert long == {}, f"these modules likely hold more than one concept; split them by concept: {long}"


# ----------------------------------------------------------------- test modules named for their tier

TESTS_DIR = REPO_ROOT / "tests"


def _marks_cluster(decorators: list[ast.expr]) -> bool:
    """Whether ``@pytest.mark.cluster`` (called or not) is among the decorators."""
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "cluster":
            return True
    return False


def _fixtures_asked(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The fixtures a test or fixture names: its parameters and ``@pytest.mark.usefixtures``."""
    asked = {arg.arg for arg in function.args.args + function.args.kwonlyargs}
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "usefixtures":
            asked |= {arg.value for arg in decorator.args if isinstance(arg, ast.Constant)}
    return asked


def _fixture_graph(tree: ast.Module) -> dict[str, set[str]]:
    """Each fixture a module defines → the fixtures it asks for."""
    return {node.name: _fixtures_asked(node) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)}


def cluster_tests_by_module(tests_dir: Path = TESTS_DIR) -> dict[str, dict[str, bool]]:
    """Module name → {test function → whether it needs a cluster}, read as conftest.py marks them: a test that
    asks (through any chain of fixtures) for one of conftest's CLUSTER_FIXTURES, or carries the ``cluster`` mark
    itself or through its module's ``pytestmark``."""
    conftest = ast.parse((tests_dir / "conftest.py").read_text(encoding="utf-8"))
    (cluster_fixtures,) = [ast.literal_eval(node.value.args[0]) for node in conftest.body
                           if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CLUSTER_FIXTURES"]
    shared_graph = _fixture_graph(conftest)
    found: dict[str, dict[str, bool]] = {}
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph = {**shared_graph, **_fixture_graph(tree)}
        module_marked = any(isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "pytestmark"
                            and ".cluster" in ast.unparse(node.value) for node in tree.body)

        def needs_cluster(names: set[str], seen: frozenset[str] = frozenset()) -> bool:
            return any(name in cluster_fixtures or (name in graph and name not in seen
                                                    and needs_cluster(graph[name], seen | {name}))
                       for name in names)

        found[path.stem] = {node.name: module_marked or _marks_cluster(node.decorator_list)
                            or needs_cluster(_fixtures_asked(node))
                            for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and node.name.startswith("test_")}
    return found


def test_a_module_named_for_the_cluster_holds_only_cluster_tests_and_no_other_module_holds_any():
    """``test_<feature>_cluster.py`` holds a feature's tests that need a real cluster, ``test_<feature>.py``
    the rest (no Ray, or an in-process Ray), so a feature's tests are found by its name and a tier by the suffix."""
    misplaced = {f"{module}.py::{test}": "needs a cluster" if cluster else "needs no cluster"
                 for module, tests in cluster_tests_by_module().items() for test, cluster in tests.items()
                 if cluster != module.endswith("_cluster")}
    assert misplaced == {}, "move each test to the module its tier names (test_<feature>_cluster.py or not)"


def test_the_tier_reader_follows_fixture_chains_and_marks(tmp_path):
    (tmp_path / "conftest.py").write_text(
        'CLUSTER_FIXTURES = frozenset({"ray_cluster"})\n\n'
        "@pytest.fixture\ndef cli(ray_cluster, tmp_path): ...\n")
    (tmp_path / "test_x.py").write_text(
        "@pytest.fixture\ndef home(cli): ...\n\n"
        "def test_chain(home): ...\n\n"
        "@pytest.mark.cluster\ndef test_marked(tmp_path): ...\n\n"
        "@pytest.mark.parametrize('x', [1])\ndef test_fast(x, tmp_path): ...\n")
    (tmp_path / "test_y_cluster.py").write_text("pytestmark = pytest.mark.cluster\n\ndef test_own(): ...\n")
    assert cluster_tests_by_module(tmp_path) == {
        "test_x": {"test_chain": True, "test_marked": True, "test_fast": False},
        "test_y_cluster": {"test_own": True}}
