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

from pathlib import Path

import pytest

from rayjobs_agent.causes import FailureReader
from rayjobs_agent.retries import RetryPolicy
from rayjobs_agent.wire import RETRY_ENV_VAR
from runner.records.store import Folder, read_run
from tests.support.waiting import HANG_GUARD_S
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
    from workloads.training.config import RayTrainSettings
    from workloads.training.trainer import run_config

    for max_failures in (0, 3, -1):
        config = run_config(storage_path(str(tmp_path)), "run", RayTrainSettings(max_failures=max_failures),
                            "val_accuracy")
        assert config.failure_config.max_failures == max_failures
