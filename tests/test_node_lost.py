"""A lost node is named from a failed job's log (``node_lost``), may be retried by that cause, and a workload's
``max_failures`` reaches Ray Train as it is.

Both logs in tests/data/logs are from real runs (Ray 2.60, torch 2.14) of the quickstart on a 3-node local
cluster, a worker node's raylet SIGKILLed during epoch 2 (tests/test_multinode_cluster.py), Ray's lines kept as
written and the raylet's own log tail left out. ``node_lost_failed_attempt.log``: ``max_failures: 0``, the
attempt fails (rank 0 was on the lost node). ``node_lost_restarted.log`` (long lines abridged):
``max_failures: 1``, the surviving rank fails first (gloo's broken connection) and Ray Train restarts on the
nodes left.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from jobs.loader import load_spec
from runner.errors import ExitCode
from runner.follow.diagnosis import FailureReader
from runner.run import retry_policy
from runner.run.policy import RunOptions, run_with_retries
from tests.support.fake_cluster import FakeClient, Script, speed_up_following

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


def test_a_failed_attempt_of_a_lost_node_is_submitted_again_when_retry_on_names_it(tmp_path, monkeypatch):
    speed_up_following(monkeypatch)
    monkeypatch.setattr(retry_policy, "sleep", lambda seconds: None)
    log = FAILED.read_bytes()
    client = FakeClient(Script(["RUNNING", "FAILED"], log=log, error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
                               driver_exit_code=1, message="Job entrypoint command failed with exit code 1"),
                        Script(["RUNNING", "SUCCEEDED"]))
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: demo\nentrypoint: python -m workloads.vision\nmax_retries: 1\n"
                         "retry_on: [node_lost]\n")
    notes = io.StringIO()
    result = run_with_retries(client, load_spec(spec_file), options=RunOptions(), notes=notes,
                              logs_out=io.StringIO())
    assert (result.exit_code, len(result.attempts)) == (ExitCode.SUCCEEDED, 2)
    assert "rayjobs: attempt 1 failed with node_lost (in retry_on); submitting attempt 2 of 2 in 10s " \
           "(retry_backoff)" in notes.getvalue().splitlines()


def test_the_workloads_max_failures_reaches_ray_train(tmp_path):
    from workloads.storage import storage_path
    from workloads.training.config import RayTrainSettings
    from workloads.training.trainer import run_config

    for max_failures in (0, 3, -1):
        config = run_config(storage_path(str(tmp_path)), "run", RayTrainSettings(max_failures=max_failures),
                            "val_accuracy")
        assert config.failure_config.max_failures == max_failures
