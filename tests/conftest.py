"""Shared fixtures: an isolated environment per test and one Ray cluster per session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from runner.local import DEFAULT_CLUSTER_NAME, LocalCluster, loopback_env
from runner.local import start as start_local_cluster
from runner.local import stop as stop_local_cluster
from tests.cli_helpers import REPO_ROOT

# Variables that would silently point code under test at some other cluster.
_FOREIGN_CLUSTER_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "RAYJOBS_CLUSTER")


def wait_for_condition(
    predicate: Callable[[], object], timeout_s: float = 30, interval_s: float = 0.2
) -> object:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Raises AssertionError after ``timeout_s``, naming the last exception the
    predicate raised, if any.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # the condition may not be checkable yet
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error!r}" if last_error else ""
            raise AssertionError(f"condition not met within {timeout_s} s{detail}")
        time.sleep(interval_s)


@contextlib.contextmanager
def _environ_set(**values: str) -> Iterator[None]:
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


@pytest.fixture(scope="session")
def ray_cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RAYJOBS_HOME of the session cluster (point CLI subprocesses here)."""
    return tmp_path_factory.mktemp("rayjobs-home")


@pytest.fixture(scope="session")
def ray_cluster(ray_cluster_home: Path) -> Iterator[LocalCluster]:
    """One token-auth local cluster (2 CPUs) shared by the whole test session."""
    # The session's own RAYJOBS_HOME keeps it apart from a user's cluster of the same name,
    # and the default name lets `rayjobs` subprocesses find it without flags.
    name = DEFAULT_CLUSTER_NAME
    with _environ_set(RAYJOBS_HOME=str(ray_cluster_home)):
        cluster = start_local_cluster(name=name, num_cpus=2)
    try:
        yield cluster
    finally:
        with _environ_set(RAYJOBS_HOME=str(ray_cluster_home)):
            stop_local_cluster(name)


@pytest.fixture
def ray_cluster_env(ray_cluster: LocalCluster, ray_cluster_home: Path) -> dict[str, str]:
    """A full environment for a subprocess that talks to the session cluster."""
    # RAY_AUTH_TOKEN would outrank the cluster's token file in Ray's lookup.
    dropped = {*_FOREIGN_CLUSTER_ENV, "RAY_AUTH_TOKEN"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.update(loopback_env(ray_cluster))
    env["RAYJOBS_HOME"] = str(ray_cluster_home)
    return env


@pytest.fixture(autouse=True)
def isolated_env(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No stray cluster address from the caller; a private RAYJOBS_HOME per test.

    Tests that use the session cluster get its RAYJOBS_HOME instead, so that
    ``runner.local.status`` and CLI subprocesses find it.
    """
    for variable in _FOREIGN_CLUSTER_ENV:
        monkeypatch.delenv(variable, raising=False)
    if "ray_cluster" in request.fixturenames:
        home = request.getfixturevalue("ray_cluster_home")
    else:
        home = tmp_path / "rayjobs-home"
    monkeypatch.setenv("RAYJOBS_HOME", str(home))


@pytest.fixture(scope="module")
def workdir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch folder shared by one test module, removed when the module is done.

    Training checkpoints of ResNet-18 weigh ~90 MB each; they must not pile up in /tmp.
    """
    import shutil

    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rj(ray_cluster: LocalCluster, ray_cluster_home: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real `rayjobs` command against the session cluster: ``rj("status", job_id)``."""
    from tests.cli_helpers import run_rayjobs

    def run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_rayjobs(*args, home=ray_cluster_home, **kwargs)

    return run


@pytest.fixture(scope="session")
def workload_ray() -> Iterator[None]:
    """One private in-process Ray shared by every workload test module that asks for it.

    Starting and stopping a Ray instance costs several seconds, so it lives until the
    session ends. Its workers run tests/train_faults.py's setup hook, which stays idle
    unless a test asks for a failing training worker.
    """
    from tests.train_faults import SETUP_HOOK

    with private_ray(log_to_driver=False, runtime_env={"worker_process_setup_hook": SETUP_HOOK}):
        yield


@contextlib.contextmanager
def private_ray(num_cpus: int = 2, **init_args: Any) -> Iterator[None]:
    """A private in-process Ray instance for workload tests; shut down afterwards.

    ``address="local"`` ignores any RAY_ADDRESS. Token auth is off: Ray 2.60 would
    otherwise write a token to the user's ~/.ray/auth_token for a new local instance.
    """
    import ray

    # Ray's worker processes inherit this environment; they need the project on their path to
    # run a setup hook from tests/ (pytest's own `pythonpath` setting reaches only this process).
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    with _environ_set(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", PYTHONPATH=python_path):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **init_args)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The endpoint URL of a real S3 server (moto's) on loopback, shared by the session."""
    from tests.s3_server import moto_s3_server

    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's AWS variables point at the test S3 server (any other AWS_* removed); returns them."""
    from tests.s3_server import aws_variables

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    values = aws_variables(s3_endpoint)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values
