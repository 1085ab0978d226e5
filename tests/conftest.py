"""Fixtures shared by every test module, and the three tiers the markers name.

- no marker: no Ray at all. The fast tier: ``pytest -m "not ray and not cluster"``.
- ``ray``: an in-process Ray (the ``workload_ray`` fixture), for the workloads' own code.
- ``cluster``: a real local cluster started with ``ray start`` (the ``ray_cluster`` fixture, or one a
  test starts itself), for what only a cluster shows: jobs submitted to a dashboard, the CLI following
  them, nodes and their processes.

A test gets its marker from the fixtures it uses, so the marker cannot drift from what the test
really starts; a test that starts Ray by other means carries the marker itself. The suite runs the
tiers in that order (fast failures first), and an unmarked test that starts Ray fails.
Helpers live in ``tests/support``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from runner.local import DEFAULT_CLUSTER_NAME, LocalCluster, loopback_env
from runner.local.environment import RAY_TRAIN_PREEMPTION_WATCHER_ENV
from tests.support.ray_instances import local_cluster_in, private_ray

# Variables that would silently point code under test at some other cluster.
# Ray Train's controller looks at its workers every 2 s, so each training run ends (and a lost worker
# is noticed) up to 2 s late. Test runs are seconds long; the Ray processes this session starts
# inherit a shorter interval. Training itself is unchanged.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Each Ray Train run starts an actor that watches for nodes being drained by a cloud provider (spot
# preemption); no test drains a node, and on 2 cores its process cost 1.5 CPU-seconds a run.
os.environ.setdefault(RAY_TRAIN_PREEMPTION_WATCHER_ENV, "0")  # as on a local cluster
# Ray's worker pool, tuned for a suite of many short runs on 2 cores, where process start-ups (each
# importing Ray, pyarrow, often torch) are much of the work: no workers are started ahead of a driver's
# first task (most went unused), and up to 16 idle workers are kept for the next tasks instead of 2 (one
# per CPU; the rest were killed after a second idle and started again moments later). Three of the
# workload test modules took 172 CPU-seconds instead of 232 with 8 kept, and two of them 192 instead of
# 214 with 16 kept instead of 8. What the tests check is unchanged.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_num_workers_soft_limit", "16")

_FOREIGN_CLUSTER_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "RAYJOBS_CLUSTER")

CLUSTER_FIXTURES = frozenset({"ray_cluster", "ray_cluster_home", "ray_cluster_env", "rayjobs_cli"})
RAY_FIXTURES = frozenset({"workload_ray"})
_FOLLOW_FAULTS_MODULE = "test_follow_faults_cluster"
# The follower's fault scenarios (~30 s, mostly waiting) run in the background of the process that checks
# them, while that process runs these modules' cluster tests first.
_FAULT_GROUP_MODULES = frozenset({_FOLLOW_FAULTS_MODULE, "test_cli_cluster"})
_FOLLOW_FAULTS_SELECTED = pytest.StashKey[bool]()


def tier_of(item: pytest.Item) -> str:
    """``cluster``, ``ray`` or ``unit``: the most a test starts, from its markers."""
    if item.get_closest_marker("cluster"):
        return "cluster"
    if item.get_closest_marker("ray"):
        return "ray"
    return "unit"


def uses_session_cluster(item: pytest.Item) -> bool:
    """Whether a test runs on the session's cluster (and so must share a test process with the others that do)."""
    used = set(getattr(item, "fixturenames", ()))
    return bool(used & CLUSTER_FIXTURES) or item.module.__name__.endswith(_FOLLOW_FAULTS_MODULE)


# tryfirst: the groups must be marked before pytest-xdist reads them (`--dist loadgroup`) in its own hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & CLUSTER_FIXTURES and used & RAY_FIXTURES:
            raise pytest.UsageError(f"{item.nodeid} uses both the in-process Ray and the session cluster; "
                                    "a test is of one tier")
        if used & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        elif used & RAY_FIXTURES or "mlflow_tracking_server" in used:
            # A local service either way: the MLflow server starts in seconds, not in the fast tier's milliseconds.
            item.add_marker(pytest.mark.ray)
        # Tests spread over the test processes by module: a module's tests stay together (its module
        # fixtures are built once), and each process starts the session-scoped Ray it needs the first time
        # a test of its asks (an in-process Ray or a cluster costs ~10 s; one process holding every test
        # that uses the session cluster made that group alone longer than the rest of the suite).
        item.add_marker(pytest.mark.xdist_group(_group_of(item, used)))
    # pytest-xdist hands out the groups in the order their first test comes. By phase first: the in-process Ray's
    # tests, then those that start clusters of their own, then those on the session cluster, then the unit
    # tests. A test process then starts its in-process Ray once and its session cluster once, and never runs
    # one idle beside the other (a Ray instance costs ~15 CPU-s to start and ~5 CPU-s a minute to keep).
    # Within a phase the longest go first, so that no test process is left with one of them while the other
    # has finished; the unit tests fill the end. A stable sort keeps each module's tests of one tier together,
    # so module fixtures are built once. In the fault group the follower's scenarios run in the background
    # while the CLI's tests run; their checks go last.
    items.sort(key=lambda item: (_phase(item), _longest_first_rank(item), not _in_fault_group(item),
                                 item.module.__name__.endswith(_FOLLOW_FAULTS_MODULE)))
    config.stash[_FOLLOW_FAULTS_SELECTED] = any(item.module.__name__.endswith(_FOLLOW_FAULTS_MODULE)
                                                for item in items)


# The modules (or groups, by one of their modules) that take longest, longest first: measured with
# `pytest --junitxml` on 2 cores (the sweep's 7 tests took 354 s of a process's time, the next ones 100-230 s).
_LONGEST_FIRST = ("test_sweep", "test_multinode_cluster", "test_vision_e2e_cluster", "test_vision_ingest",
                  "test_vision_train", "test_learning_real_photos_cluster", "test_diagnosis_cluster",
                  "test_cli_cluster", "test_training_last_batch", "test_local_clusters_cluster",
                  "test_queue_history_cluster", "test_queue_faults_cluster", "test_node_lost_cluster",
                  "test_progress_cluster", "test_code_upload_cluster", "test_hf_vit", "test_queue_cluster",
                  "test_run_policy_cluster")


def _phase(item: pytest.Item) -> int:
    """When a test runs: the in-process Ray's tier, own clusters, the session cluster, then the unit tests."""
    tier = tier_of(item)
    if tier == "ray":
        return 0
    if tier == "cluster":
        return 2 if uses_session_cluster(item) else 1
    return 3


def _longest_first_rank(item: pytest.Item) -> int:
    module = item.module.__name__.rsplit(".", 1)[-1]
    if module == _FOLLOW_FAULTS_MODULE:
        module = "test_cli_cluster"  # its group's
    if "tiny_run" in getattr(item, "fixturenames", ()):
        module = "test_vision_train"  # the shared run's group
    return _LONGEST_FIRST.index(module) if module in _LONGEST_FIRST else len(_LONGEST_FIRST)


def _in_fault_group(item: pytest.Item) -> bool:
    return item.module.__name__.rsplit(".", 1)[-1] in _FAULT_GROUP_MODULES


def _group_of(item: pytest.Item, used: set[str]) -> str:
    """The xdist group of a test: the tests that must share one test process's session-scoped state."""
    module = item.module.__name__.rsplit(".", 1)[-1]
    if "tiny_run" in used:
        # The shared training run is trained once per process: every test that reads it goes with it.
        return "tiny-run"
    if uses_session_cluster(item) and _in_fault_group(item):
        return "session-cluster:follow-faults"
    return f"module:{module}"


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The in-process Ray serves the `ray` tier only: it goes when that tier ends, so the cluster tier
    # gets the machine to itself (and the Ray client's in-process commands there meet no second Ray). A
    # connection a cluster test's in-process command left goes before the unit tests, which must start none.
    # A module's unit tests run in its group after its `ray` tests: the in-process Ray waits through them
    # (they start none of their own, `_unmarked_tests_start_no_ray`), since the next group may be of the `ray`
    # tier again, and starting Ray anew cost ~15 CPU-seconds and the workers it had kept.
    tier, following = tier_of(item), (tier_of(nextitem) if nextitem is not None else None)
    if following == tier or {tier, following} == {"ray", "unit"}:
        return
    if _ray_is_up():
        sys.modules["ray"].shutdown()


def _ray_is_up() -> bool:
    """Whether this process has a Ray connection (its in-process Ray, or a client of a cluster)."""
    ray = sys.modules.get("ray")
    return ray is not None and getattr(ray, "is_initialized", lambda: False)()


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """The fast tier's promise: a test without a marker starts no Ray in this process."""
    up_before = _ray_is_up()
    yield
    if tier_of(request.node) == "unit" and not up_before and _ray_is_up():
        sys.modules["ray"].shutdown()
        pytest.fail("this test started Ray: mark it `ray` (or use the workload_ray fixture)")


@pytest.fixture(autouse=True)
def _ctrl_c_handler_given_back() -> Iterator[None]:
    """A test leaves the process's Ctrl-C handler as it found it: Ray Train's ``fit()`` installs its own in the
    driver and keeps it, and a later test in the same test process would otherwise run (and judge) under it."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before and before is not None:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True)
def _follow_fault_scenarios_start_with_the_cluster_tier(request: pytest.FixtureRequest) -> None:
    """The first test of the fault group starts the follower's fault scenarios, when tests/test_follow_faults_cluster.py
    will check them (in the same test process)."""
    if (uses_session_cluster(request.node) and _in_fault_group(request.node)
            and request.config.stash.get(_FOLLOW_FAULTS_SELECTED, False)):
        request.getfixturevalue("follow_fault_scenarios")


@pytest.fixture(scope="session")
def follow_fault_scenarios(ray_cluster: LocalCluster, ray_cluster_home: Path,
                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The follower's fault scenarios (tests/support/follow_scenarios.py), running in the background: name → future."""
    from tests.support.follow_scenarios import start_scenarios

    pool, futures = start_scenarios(ray_cluster, ray_cluster_home, tmp_path_factory.mktemp("follow-faults"))
    yield futures
    pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def ray_cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RAYJOBS_HOME of the session cluster (point CLI subprocesses here)."""
    return tmp_path_factory.mktemp("rayjobs-home")


@pytest.fixture(scope="session")
def ray_cluster(ray_cluster_home: Path) -> Iterator[LocalCluster]:
    """One token-auth local cluster (2 CPUs) shared by the whole test session."""
    # The session's own RAYJOBS_HOME keeps it apart from a user's cluster of the same name,
    # and the default name lets `rayjobs` subprocesses find it without flags.
    with local_cluster_in(ray_cluster_home, DEFAULT_CLUSTER_NAME, num_cpus=2) as cluster:
        _SESSION_CLUSTER.append(cluster)
        try:
            yield cluster
        finally:
            _SESSION_CLUSTER.clear()


# The session cluster while it runs, for the report of a failed test on it.
_SESSION_CLUSTER: list[LocalCluster] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test on the session cluster reports the state of the cluster's queue beside its error: a failure
    seen only in CI is then read from CI's output."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and _SESSION_CLUSTER and uses_session_cluster(item):
        from tests.support.cluster_state import describe_queue_state

        try:
            report.sections.append(("the session cluster's queue", describe_queue_state(_SESSION_CLUSTER[0])))
        except Exception as exc:  # noqa: BLE001 - the failure itself is reported whatever happens here
            report.sections.append(("the session cluster's queue", f"could not be described: {exc!r}"))


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
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rayjobs_cli(ray_cluster: LocalCluster, ray_cluster_home: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real `rayjobs` command against the session cluster: ``rayjobs_cli("status", job_id)``."""
    from tests.support.cli import run_rayjobs

    def run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_rayjobs(*args, home=ray_cluster_home, **kwargs)

    return run


@pytest.fixture(scope="session")
def _private_ray_stack() -> Iterator[contextlib.ExitStack]:
    """Where the in-process Ray's start-ups are kept, so that the session's end shuts down the last one."""
    with contextlib.ExitStack() as stack:
        yield stack


def _ensure_private_ray(stack: contextlib.ExitStack) -> None:
    """Start the in-process Ray unless it is up: a Ray started implicitly (by Ray Train or Ray Data) would lack the
    setup hook the fault-injecting tests need."""
    import ray

    from tests.support.train_faults import SETUP_HOOK

    if not ray.is_initialized():
        stack.enter_context(private_ray(log_to_driver=False, runtime_env={"worker_process_setup_hook": SETUP_HOOK}))


@pytest.fixture(scope="session")
def workload_ray(_private_ray_stack: contextlib.ExitStack) -> None:
    """One private in-process Ray shared by every test that asks for it (marker ``ray``).

    Starting and stopping a Ray instance costs several seconds, so it lives until the
    session ends, or until this test process turns to tests of another tier (see
    ``pytest_runtest_teardown``). Its workers run tests/support/train_faults.py's setup hook, which stays
    idle unless a test asks for a failing training worker.
    """
    _ensure_private_ray(_private_ray_stack)


@pytest.fixture(autouse=True)
def _workload_ray_is_up(request: pytest.FixtureRequest) -> None:
    """A test process whose tests came in two tiers shut its in-process Ray down in between: start it again."""
    if "workload_ray" in request.fixturenames:
        _ensure_private_ray(request.getfixturevalue("_private_ray_stack"))


@pytest.fixture(scope="session")
def tiny_run(workload_ray: None, _private_ray_stack: contextlib.ExitStack,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The small training run (with one worker lost and restored) and its batch inference, shared by the
    workload tests: see tests/support/tiny_run.py. Tests that change a run work on a copy."""
    from tests.support.tiny_run import train_tiny_run

    _ensure_private_ray(_private_ray_stack)
    directory = tmp_path_factory.mktemp("tiny-run")
    yield train_tiny_run(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real MLflow tracking server on loopback (SQLite store), shared by the session's tracking tests."""
    pytest.importorskip("mlflow", reason="MLflow's client and server come with the dev extra")
    from tests.support.mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The endpoint URL of a real S3 server (moto's) on loopback, shared by the session."""
    from tests.support.s3_server import moto_s3_server

    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's AWS variables point at the test S3 server (any other AWS_* removed); returns them."""
    from tests.support.s3_server import aws_variables

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    values = aws_variables(s3_endpoint)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values
