"""A private in-process Ray for the workload tests (marker ``ray``), and setting variables around it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from tests.support.cli import REPO_ROOT


@contextlib.contextmanager
def environ_set(**values: str) -> Iterator[None]:
    """Set environment variables for a block; session fixtures cannot use monkeypatch."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def private_ray(num_cpus: int = 2, **init_args: Any) -> Iterator[None]:
    """A private in-process Ray instance; shut down afterwards.

    ``address="local"`` ignores any RAY_ADDRESS. Token auth is off: Ray 2.60 would
    otherwise write a token to the user's ~/.ray/auth_token for a new local instance.
    """
    import ray

    # Ray's worker processes inherit this environment; they need the project on their path to
    # run a setup hook from tests/ (pytest's own `pythonpath` setting reaches only this process).
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    with environ_set(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", PYTHONPATH=python_path):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **init_args)
        try:
            yield
        finally:
            ray.shutdown()


def driver_env_joining_this_ray(**extra: str) -> dict[str, str]:
    """The environment of a subprocess whose ``ray.init()`` joins this process's Ray, as a job's driver joins its cluster.

    Joining costs a fraction of the ten seconds a fresh local Ray takes to start.
    """
    import ray

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}
    env.pop("RAYJOBS_WORKLOAD", None)
    env.pop("RAY_ADDRESS", None)
    if ray.is_initialized():
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return env


def kill_processes(processes: list[Any]) -> None:
    """SIGKILL each of ``processes`` (``psutil.Process``), as a machine losing power would; one that ended since it
    was listed (a short-lived helper of the cluster) is skipped."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@contextlib.contextmanager
def local_cluster_in(home: os.PathLike | str, name: str, num_cpus: int) -> Iterator[Any]:
    """A local cluster started with ``home`` as its RAYJOBS_HOME, stopped when the block ends: its ``LocalCluster``."""
    from runner.local import start, stop

    with environ_set(RAYJOBS_HOME=str(home)):
        cluster = start(name=name, num_cpus=num_cpus)
    try:
        yield cluster
    finally:
        with environ_set(RAYJOBS_HOME=str(home)):
            stop(name)
