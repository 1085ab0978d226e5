"""Every private Ray symbol rayjobs relies on (jobs/infra/ray_internals.py) exists in the installed Ray.

An upgrade of Ray that drops or moves one fails here first, naming the version and the symbol,
instead of in a job on a cluster.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from jobs.infra import ray_internals
from tests.support.cli import REPO_ROOT


def _resolve(module: str, attribute: str) -> object:
    found: object = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


@pytest.mark.parametrize("module, attribute", ray_internals.PRIVATE_SYMBOLS,
                         ids=[f"{m}.{a}" for m, a in ray_internals.PRIVATE_SYMBOLS])
def test_private_symbol_exists_in_the_installed_ray(module, attribute):
    import ray

    try:
        _resolve(module, attribute)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"Ray {ray.__version__} has no {module}.{attribute} ({exc}); jobs/infra/ray_internals.py must "
                    "follow it to its new place or do without it")


def test_the_snapshot_file_name_and_train_v2_switch_answer():
    assert ray_internals.checkpoint_snapshot_filename().endswith(".json")
    assert isinstance(ray_internals.train_v2_enabled(), bool)


def _private_ray_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ray"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("ray"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("ray."):
            names.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr == "_do_request":
            names.add("_do_request")
    return {name for name in names if "._private" in name or "._internal" in name or name == "_do_request"}


# Runs inside jobs that may have no copy of `jobs/` (a user's own working_dir): the observer's own uses of
# Ray's private code (Ray Train's callback interfaces, the GCS client of the queue) stay in its own module.
ON_CLUSTER_INTERNALS = REPO_ROOT / "rayjobs_agent" / "ray_internals.py"


def test_the_progress_callbacks_interfaces_are_where_ray_keeps_them():
    from rayjobs_agent.train_hooks.progress_callback import ProgressCallback

    from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

    for interface in (ControllerCallback, ReportCallback, WorkerGroupCallback):
        for hook in ("after_controller_start", "after_worker_group_start", "after_report",
                     "after_controller_state_update"):
            if hook in vars(ProgressCallback) and hasattr(interface, hook):
                # The hook the callback implements still has the arguments Ray calls it with.
                import inspect

                assert list(inspect.signature(getattr(interface, hook)).parameters) == \
                    list(inspect.signature(getattr(ProgressCallback, hook)).parameters), (interface, hook)


def test_no_module_but_ray_internals_touches_ray_private_code():
    offenders = {}
    for package in ("jobs", "runner", "workloads"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if path in (Path(ray_internals.__file__).resolve(), ON_CLUSTER_INTERNALS):
                continue
            found = _private_ray_names(ast.parse(path.read_text(encoding="utf-8")))
            if found:
                offenders[str(path.relative_to(REPO_ROOT))] = sorted(found)
    assert offenders == {}, "use jobs.infra.ray_internals instead"
