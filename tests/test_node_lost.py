"""A lost node is named from a failed job's log (``node_lost``), may be retried in place by that cause, and a workload's
``max_failures`` reaches Ray Train as it is.

Both logs in tests/data/logs are from real runs (Ray 2.60, torch 2.14) of the quickstart on a 3-node local
cluster, a worker node's raylet SIGKILLed during epoch 2 (tests/test_multinode_cluster.py), Ray's lines kept as
written and the raylet's own log tail left out. ``node_lost_failed_attempt.log``: ``max_failures: 0``, the
attempt fails (rank 0 was on the lost node). ``node_lost_restarted.log`` (long lines abridged):
``max_failures: 1``, the surviving rank fails first (gloo's broken connection) and Ray Train restarts on the
nodes left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayjobs_agent.causes import FailureReader, read_failure
from rayjobs_agent.retries import RetryPolicy
from rayjobs_agent.wire import RETRY_ENV_VAR
from runner.records.store import Folder, read_run
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.test_record import config_for, keeper_env, run_keeper

LOGS = Path(__file__).parent / "data" / "logs"
FAILED = LOGS / "node_lost_failed_attempt.log"
RESTARTED = LOGS / "node_lost_restarted.log"
RESTART_EVENT = '"event":"attempt","time":1795633271.31'


def _lines(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines()


def _read(lines: list[str]) -> FailureReader:
    reader = FailureReader()
    for line in lines:
        reader.line(line)
    return reader


def test_a_lost_node_is_named_from_the_real_log_of_the_attempt_it_failed():
    diagnosis = _read(_lines(FAILED)).diagnose()
    assert diagnosis is not None and diagnosis.cause == "node_lost"
    assert diagnosis.text.startswith("A node of the cluster was lost while the job ran (")
    assert "retry_on: [node_lost]" in diagnosis.advice
    assert not diagnosis.evidence.startswith("(")


@pytest.mark.parametrize("marker", ["has been marked dead because the detector has missed too many heartbeats",
                                    "The actor died because its node has died",
                                    "Raylet is terminated. Termination is unexpected"])
def test_each_of_rays_lines_for_a_lost_node_names_it_alone(marker):
    line = next(line for line in _lines(RESTARTED) if marker in line)
    assert _read([line]).diagnose().cause == "node_lost"


def test_the_peers_broken_connection_alone_names_no_cause():
    # A rank whose peer process crashed reads the same: it is not taken for a lost node.
    broken = [line for line in _lines(RESTARTED) if "Connection reset by peer" in line]
    assert broken and _read(broken).diagnose() is None


def test_a_node_loss_that_training_went_on_after_is_forgotten():
    lines = _lines(RESTARTED)
    restart = next(index for index, line in enumerate(lines) if RESTART_EVENT in line)
    assert _read(lines[:restart]).diagnose().cause == "node_lost"
    assert _read(lines).diagnose() is None


def test_an_attempt_that_lost_a_node_runs_again_in_place_when_retry_on_names_it(tmp_path):
    """The agent reads the real failed attempt's log as the entrypoint writes it, names node_lost, and runs the
    entrypoint again in the same job (here the second run succeeds)."""
    marker = tmp_path / "marker"
    entrypoint = (f"if [ ! -e {marker} ]; then touch {marker}; cat {FAILED}; exit 1; fi; echo 'second attempt: done'")
    log = tmp_path / "log"
    environ = keeper_env(config_for(tmp_path / "run"))
    environ[RETRY_ENV_VAR] = RetryPolicy(1, ("node_lost",), 0.0, 1.0).to_variable()
    keeper = run_keeper(entrypoint, log, environ)
    assert keeper.wait(timeout=HANG_GUARD_S) == 0, log.read_text()
    assert "attempt 1 failed with node_lost (in retry_on); running attempt 2 of 2" in log.read_text()
    first, second = read_run(Folder(str(tmp_path / "run")))["attempts"]
    assert (first["cause"]["cause"], first["status"], second["status"]) == ("node_lost", "FAILED", "SUCCEEDED")


def test_the_workloads_max_failures_reaches_ray_train(tmp_path):
    from workloads.storage import storage_path
    from workloads.ray_train.config import RayTrainSettings
    from workloads.ray_train.trainer import run_config

    for max_failures in (0, 3, -1):
        config = run_config(storage_path(str(tmp_path)), "run", RayTrainSettings(max_failures=max_failures),
                            "val_accuracy")
        assert config.failure_config.max_failures == max_failures


def test_ray_train_gets_a_bounded_number_of_tries_at_placing_a_runs_workers(tmp_path):
    from workloads.storage import storage_path
    from workloads.ray_train.config import RayTrainSettings
    from workloads.ray_train.restarts import START_TRIES
    from workloads.ray_train.trainer import run_config

    config = run_config(storage_path(str(tmp_path)), "run", RayTrainSettings(max_failures=-1), "val_accuracy")
    # Ray Train's own default is -1: a worker group the nodes up cannot hold is tried for ever.
    assert config.failure_config.controller_failure_limit == START_TRIES - 1


# ----------------------------------------------------------------- restarts that cannot be placed


class RestartingState:
    """Stands for Ray Train's controller state of the same name (the guard reads states by their names)."""


class RunningState:
    pass


@pytest.fixture
def quick_tries(monkeypatch):
    """Tries of 0.05 s each (patience 0.5 s), and a guard that does not slow its loop."""
    from workloads.ray_train import restarts

    monkeypatch.setenv(restarts.START_TIMEOUT_ENV_VAR, "0.05")
    monkeypatch.setattr(restarts, "WAIT_STEP_S", 0.0)
    return restarts


def test_the_guard_ends_a_wait_for_nodes_that_outlasts_the_tries_a_fixed_layout_gets(quick_tries):
    guard = quick_tries.PlacementGuard(2, {"CPU": 1.0})
    waiting = RestartingState()
    guard.after_controller_state_update(RunningState(), waiting)  # the restart itself

    def ended() -> BaseException | None:
        try:
            guard.after_controller_state_update(waiting, waiting)  # Ray Train decided again: start nothing
        except quick_tries.WorkersNotPlaced as exc:
            return exc
        return None

    error = wait_for_condition(ended, timeout_s=HANG_GUARD_S, interval_s=0.01)
    assert re.search(r"fewer than 2 worker\(s\) of \{'CPU': 1.0\} for \d+ s \(10 tries of "
                     r"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 0.05 s\)", str(error)), error


def test_the_guard_counts_one_wait_from_when_it_began_and_forgets_it_once_workers_start(quick_tries):
    guard = quick_tries.PlacementGuard(1, {"CPU": 1.0})
    waiting = RestartingState()
    guard.after_controller_state_update(waiting, waiting)
    started = guard.waiting_since
    guard.after_controller_state_update(waiting, waiting)
    assert guard.waiting_since == started
    guard.after_controller_state_update(waiting, RunningState())
    assert guard.waiting_since is None
    # A state entered anew is no wait (Ray Train moved on, to schedule or to fail again).
    guard.after_controller_state_update(RunningState(), RestartingState())
    assert guard.waiting_since is None


def test_a_worker_group_never_placed_is_said_in_words_the_cause_table_names():
    import pickle

    import ray.train
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    from workloads.ray_train.trainer import failure_text

    # As fit() meets it: raised in the controller, pickled to the driver, its __cause__ gone on the way.
    error = pickle.loads(pickle.dumps(ray.train.ControllerError(WorkerGroupStartupTimeoutError(num_workers=3))))
    text = failure_text(error)
    assert text.startswith("WorkerGroupStartupTimeoutError: 3 workers could not be placed in 10 tries of ")
    diagnosis = read_failure(f"error: training run 'x' failed: {text}")
    assert diagnosis is not None and diagnosis.cause == "workers_not_placed" and diagnosis.retryable


def test_a_workers_own_error_is_still_its_root_cause():
    import pickle

    import ray.train

    from workloads.ray_train.trainer import failure_text

    error = pickle.loads(pickle.dumps(ray.train.WorkerGroupError("rank 0 failed", {0: ValueError("bad input")})))
    assert failure_text(error) == "ValueError: bad input"


@pytest.mark.usefixtures("workload_ray")
def test_an_elastic_run_the_nodes_up_cannot_hold_ends_with_its_cause_instead_of_waiting_for_ever(
        tmp_path, monkeypatch):
    """Ray Train's elastic controller, real: nothing on the cluster holds even one worker (a resource no node has),
    so it decides again and again to start nothing; the guard ends that wait after the tries' time."""
    from workloads.storage import storage_path
    from workloads.ray_train.config import RayTrainSettings
    from workloads.ray_train.restarts import START_TIMEOUT_ENV_VAR
    from workloads.ray_train.trainer import TrainingError, fit

    monkeypatch.setenv(START_TIMEOUT_ENV_VAR, "0.3")  # read by the controller: the driver's value reaches it
    settings = RayTrainSettings(num_workers=2, min_workers=1, cpus_per_worker=1,
                                resources_per_worker={"rayjobs_test_absent": 1.0}, max_failures=0)
    with pytest.raises(TrainingError) as failed:
        fit(lambda config: None, {}, storage_path(str(tmp_path)), "never-placed", settings, "loss")
    message = str(failed.value)
    assert message.startswith("training run 'never-placed' failed: WorkersNotPlaced: the nodes up held fewer than 1 "
                              "worker(s) of {'CPU': 1.0, 'rayjobs_test_absent': 1.0}"), message
    assert read_failure(f"error: {message}").cause == "workers_not_placed"
